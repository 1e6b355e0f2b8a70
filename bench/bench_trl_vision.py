"""The VLM workload of ``bench_trl.py --vision``: the tiny Qwen2.5-VL (random weights,
built here) with a processor for images up to ``--image-size`` pixels square, and prompts
of one image each (mostly image tokens, as EasyR1's geometry prompts are), the same for
both sides: our trainer reads them from parquet (``<image>`` marks the image), TRL from a
``datasets.Dataset`` whose ``image`` column it puts before the prompt's text, as our
template does.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

# Colours of the prompts' images: the task (a dense reward for saying "7") does not read
# them; they make the vision tower's input differ from prompt to prompt.
COLORS = [(200, 30, 30), (30, 160, 60), (40, 60, 200), (220, 200, 40)]
PROBLEM = "How many shapes are in the picture? Say the number 7 please {i}"


def _png(color: tuple[int, int, int], side: int, i: int) -> bytes:
    """A square picture with a few shapes: not a flat colour, so patches differ."""
    import io

    from PIL import Image, ImageDraw

    img = Image.new("RGB", (side, side), color)
    draw = ImageDraw.Draw(img)
    for k in range(1 + i % 4):
        x = (37 * (k + 1) * (i + 3)) % max(1, side - 40)
        draw.ellipse((x, x // 2, x + 36, x // 2 + 36), fill=(255 - color[0], 90, 255 - color[2]))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def build_workload(tmp: Path, args: argparse.Namespace) -> tuple[Path, Path, list[dict[str, Any]]]:
    """The model, our parquet split, and TRL's rows (problem text, PNG bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from grpo_testkit.tiny_models import build_tiny_qwen2_5_vl, save_vl_processor

    # The processor keeps images up to image_size^2 pixels: (image_size / 28)^2 tokens
    # each. (These two builders are also the main branch's: the bench runs its trainer.)
    model = build_tiny_qwen2_5_vl(tmp / "model", hidden=args.hidden, layers=args.layers)
    save_vl_processor(model, AutoTokenizer.from_pretrained(model), 28 * 28, args.image_size**2)
    rows = [{"problem": PROBLEM.format(i=i), "answer": "7",
             "png": _png(COLORS[i % len(COLORS)], args.image_size, i)}
            for i in range(max(64, args.prompts * 4))]
    data = tmp / "prompts.parquet"
    pq.write_table(pa.table({
        "problem": ["<image>" + r["problem"] for r in rows],
        "answer": [r["answer"] for r in rows],
        "images": [[{"bytes": r["png"], "path": None}] for r in rows],
    }), data)
    return model, data, rows


def trl_dataset(rows: list[dict[str, Any]]) -> Any:
    """TRL's rows: the prompt's text as a user message and its picture (TRL puts an image
    placeholder before the text, which the processor expands)."""
    import io

    from datasets import Dataset, Image
    from PIL import Image as PILImage

    ds = Dataset.from_list([
        {"prompt": [{"role": "user", "content": r["problem"]}],
         "image": PILImage.open(io.BytesIO(r["png"])).convert("RGB")}
        for r in rows
    ])
    return ds.cast_column("image", Image())
