"""Tiny EasyR1-layout datasets (problem / answer / images) for tests, demos and
`grpo-train make-tiny`."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path


def write_text_task(path: str | Path, rows: int = 16, target: str = "7") -> Path:
    """Prompts whose reward is emitting ``target``; written as jsonl."""
    path = Path(path)
    with open(path, "w") as f:
        for i in range(rows):
            f.write(
                json.dumps({"problem": f"Say the number {target} please {i}", "answer": target})
                + "\n"
            )
    return path


def png(color: tuple[int, int, int], size: tuple[int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def write_vision_task(path: str | Path, rows: int = 8) -> Path:
    """Parquet with one image per row as bytes, a ``<image>`` marker, and a numeric answer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    table = pa.table(
        {
            "problem": [f"<image>How many shapes are in the picture? ({i})" for i in range(rows)],
            "answer": [str(i % 4 + 1) for i in range(rows)],
            "images": [
                [{"bytes": png(colors[i % 4], (40 + 4 * (i % 3), 36)), "path": None}]
                for i in range(rows)
            ],
        }
    )
    pq.write_table(table, path)
    return path


def write_mixed_task(path: str | Path, rows: int = 8, images: Sequence[int] = (1, 0),
                     row_group_size: int | None = None, videos: Sequence[int] = (0,),
                     frames: int = 4) -> Path:
    """Parquet whose rows have ``images[i % len(images)]`` images and
    ``videos[i % len(videos)]`` videos each (a video: ``frames`` PNG frames, a frame list
    as EasyR1's ``videos`` column may hold; none of either: a text-only row, empty lists
    and no marker), as real VLM datasets mix them; with ``row_group_size``, that many rows
    a row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    counts = [images[i % len(images)] for i in range(rows)]
    clips = [videos[i % len(videos)] for i in range(rows)]
    media = [n + v for n, v in zip(counts, clips, strict=True)]
    table = pa.table(
        {
            "problem": ["<image>" * n + "<video>" * v + f"How many shapes are shown? ({i})"
                        if n + v else f"What is {i} plus {i}?"
                        for i, (n, v) in enumerate(zip(counts, clips, strict=True))],
            "answer": [str(i % 4 + 1) if m else str(2 * i) for i, m in enumerate(media)],
            "images": [
                [{"bytes": png((255 - 40 * k, 20 * i % 256, 0), (40, 36)), "path": None}
                 for k in range(n)]
                for i, n in enumerate(counts)
            ],
            "videos": pa.array(
                [[[png((30 * f % 256, 10 * i % 256, 200), (56, 56)) for f in range(frames)]
                  for _ in range(v)] for i, v in enumerate(clips)],
                type=pa.list_(pa.list_(pa.binary()))),
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


# Bytes that begin as a JPEG does and are none: PIL cannot identify them.
NOT_AN_IMAGE = b"\xff\xd8 a JPEG cut off"


def write_with_corrupt_image(src: str | Path, dst: str | Path, row: int) -> Path:
    """``src`` (a parquet task) written to ``dst`` with row ``row``'s images replaced by
    one that is no image (NOT_AN_IMAGE): a dataset with a bad row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(src).to_pylist()
    rows[row]["images"] = [{"bytes": NOT_AN_IMAGE, "path": None}]
    pq.write_table(pa.Table.from_pylist(rows), dst)
    return Path(dst)
