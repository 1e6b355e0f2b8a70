"""Tiny EasyR1-layout datasets (problem / answer / images) for tests, demos and
`grpo-train make-tiny`."""

from __future__ import annotations

import io
import json
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


def write_mixed_task(path: str | Path, rows: int = 8) -> Path:
    """Parquet alternating a row with one image and a text-only row (an empty ``images``
    list, no marker), as real VLM datasets mix them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    with_image = [i % 2 == 0 for i in range(rows)]
    table = pa.table(
        {
            "problem": [f"<image>How many shapes are in the picture? ({i})" if img
                        else f"What is {i} plus {i}?" for i, img in enumerate(with_image)],
            "answer": [str(i % 4 + 1) if img else str(2 * i) for i, img in enumerate(with_image)],
            "images": [
                [{"bytes": png((255, 0, 0), (40, 36)), "path": None}] if img else []
                for img in with_image
            ],
        }
    )
    pq.write_table(table, path)
    return path
