"""The driver's index of the prompt rows (grpo_trainer.dataset): rows read back where they
are used equal the rows, the index holds a few bytes a row, the length pass is kept and
reused, bad rows are named or skipped, and lazy lengths decide at draw time the same way
on every attempt."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_api.contract import INDEX_BYTES_PER_ROW
from grpo_api.trainer_config import Config, DataConfig
from grpo_trainer.config_error import ConfigError
from grpo_trainer.data import Record
from grpo_trainer.dataset import (
    DrawCheck,
    PromptDataset,
    StatefulLoader,
    encode_rows,
    read_records,
)
from grpo_trainer.dataset import index as index_mod
from grpo_trainer.rewards import reward_rows

pytestmark = pytest.mark.unit


def _png(seed: int, size: tuple[int, int] = (8, 8)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (seed % 256, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(seed: int) -> bytes:
    """A noisy 64 x 64 JPEG: most of its bytes are scan data, after the header."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


def _chars(record: Record) -> int:
    """A stand-in tokenizer: one token per character, 10 per image."""
    return len(record.problem) + 10 * len(record.images)


def _parquet(path: Path, rows: list[dict], row_group_size: int = 3) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def _mixed(tmp_path: Path) -> tuple[Path, Path]:
    """A parquet of text-only, one- and three-image rows in several row groups, and a
    jsonl with image paths and a blank line."""
    rows = []
    for i in range(11):
        n = (0, 1, 3)[i % 3]
        rows.append({"problem": f"<image>q{i}" if n else f"text q{i}", "answer": str(i),
                     "images": [{"bytes": _png(i * 10 + k), "path": None} for k in range(n)]})
    a = _parquet(tmp_path / "a.parquet", rows)
    (tmp_path / "p.png").write_bytes(_png(99))
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"problem": "look", "answer": "x", "images": ["p.png"]}) + "\n\n"
                 + json.dumps({"problem": "no image", "answer": "y"}) + "\n")
    return a, b


def test_rows_read_where_used_equal_the_rows_and_the_driver_holds_a_few_bytes_each(
    tmp_path: Path,
) -> None:
    a, b = _mixed(tmp_path)
    cfg = DataConfig(train_files=["x"], max_images_per_prompt=3)
    ds = PromptDataset([str(a), str(b)], cfg, prompt_tokens=_chars)
    assert len(ds) == 13
    assert ds.index.nbytes / len(ds) <= INDEX_BYTES_PER_ROW
    assert ds.most("images") == 3
    # Read by refs, in any order (as a rank reads its share): the same rows as a plain read.
    plain = pq.read_table(a).to_pylist()
    order = [12, 0, 5, 11, 7, 1]
    got = read_records([ds.ref(i) for i in order], cfg)
    for i, rec in zip(order, got, strict=True):
        assert rec.index == i
        if i < 11:
            assert (rec.source, rec.row) == (str(a), i)
            assert rec.problem == plain[i]["problem"] and rec.answer == plain[i]["answer"]
            assert rec.images == [x["bytes"] for x in plain[i]["images"]]
    assert got[0].problem == "no image" and got[0].images == [] and got[0].row == 1
    assert read_records([ds.ref(11)], cfg)[0].images == [_png(99)]
    # The driver reads only the answer column of a drawn batch (for a reward of the
    # response and the answer), or the whole row (for one that reads rows).
    answers = reward_rows([ds.ref(i) for i in order], cfg, whole=False)
    assert [r.ground_truth for r in answers] == ["y", "0", "5", "x", "7", "1"]
    # (a parquet file's other columns unread; a jsonl row is one line, read whole)
    assert all(set(r.columns) == {"answer"} for r, i in zip(answers, order, strict=True)
               if ds.ref(i).offset < 0)
    assert any(ds.ref(i).offset < 0 for i in order)
    whole = reward_rows([ds.ref(i) for i in order], cfg, whole=True)
    assert [r.ground_truth for r in whole] == ["y", "0", "5", "x", "7", "1"]
    assert all({"problem", "answer"} <= set(r.columns) for r in whole)
    assert any("images" in r.columns for r in whole)
    # Counted as the stand-in tokenizer counts the rows themselves.
    assert [int(t) for t in ds.index.tokens] == [_chars(r) for r in ds.records]


def test_the_length_pass_is_kept_and_reused_until_a_file_or_setting_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _mixed(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    config = Config.model_validate({"model": {"path": str(model)},
                                    "data": {"train_files": [str(a), str(b)],
                                             "max_images_per_prompt": 3}})
    cache = tmp_path / "ckpt"
    first = PromptDataset([str(a), str(b)], config.data, prompt_tokens=_chars, config=config,
                          cache_dir=cache)
    (kept,) = (cache / "data-index").glob("*.npz")
    passes: list[int] = []
    real = index_mod.run_pass

    def counting(*args: object, **kwargs: object) -> object:
        passes.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(index_mod, "run_pass", counting)
    again = PromptDataset([str(a), str(b)], config.data, prompt_tokens=_chars, config=config,
                          cache_dir=cache)
    assert not passes  # the second start reads the kept index
    assert [r.index for r in again.refs()] == [r.index for r in first.refs()]
    assert (again.index.tokens == first.index.tokens).all()
    # The tokenizer changed: counted again, under another key.
    (model / "tokenizer.json").write_text('{"changed": 1}')
    PromptDataset([str(a), str(b)], config.data, prompt_tokens=_chars, config=config,
                  cache_dir=cache)
    assert len(passes) == 1 and len(list((cache / "data-index").glob("*.npz"))) == 2
    # A file rewritten: counted again.
    b.write_text(json.dumps({"problem": "other", "answer": "z"}) + "\n")
    PromptDataset([str(a), str(b)], config.data, prompt_tokens=_chars, config=config,
                  cache_dir=cache)
    assert len(passes) == 2
    # A kept index that cannot be read is counted again, not trusted.
    kept.write_bytes(b"torn")
    (model / "tokenizer.json").write_text("{}")
    b.write_text(json.dumps({"problem": "look", "answer": "x", "images": ["p.png"]}) + "\n")
    PromptDataset([str(a), str(b)], config.data, prompt_tokens=_chars, config=config,
                  cache_dir=cache)
    assert len(passes) == 3


def _with_bad_rows(tmp_path: Path) -> Path:
    rows = [{"problem": f"q{i}", "answer": str(i), "images": [{"bytes": _jpeg(i), "path": None}]}
            for i in range(6)]
    rows[1]["images"] = [{"bytes": b"this is not an image", "path": None}]
    rows[2]["problem"] = "   "
    rows[3]["answer"] = None
    rows[4]["images"] = [{"bytes": None, "path": "missing.png"}]
    return _parquet(tmp_path / "bad.parquet", rows)


def test_bad_rows_fail_naming_the_file_row_and_what_or_are_skipped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = _with_bad_rows(tmp_path)
    cfg = DataConfig(train_files=["x"])
    with pytest.raises(ConfigError) as err:
        PromptDataset([str(f)], cfg, prompt_tokens=_image_tokens)
    assert err.value.field == "data.bad_rows"
    assert str(err.value).startswith(f"data.bad_rows: {f} row 1: image 1 is not an image that "
                                     "can be read (UnidentifiedImageError, 20 bytes); fix the row")
    assert "set data.bad_rows (spec.data.badRows) to skip" in str(err.value)
    caplog.set_level(logging.WARNING)
    ds = PromptDataset([str(f)], cfg.model_copy(update={"bad_rows": "skip"}),
                       prompt_tokens=_image_tokens)
    assert [r.row for r in ds.records] == [0, 5] and ds.bad_rows == 4
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped")]
    assert line.startswith("skipped 4 of 6 prompts of data.train_files (data.bad_rows "
                           "(spec.data.badRows): skip): ")
    assert f"{f} row 2: the prompt (column 'problem') is empty" in line
    assert f"{f} row 3: no answer (column 'answer' is missing or null)" in line
    assert f"{f} row 4: image 1 {tmp_path / 'missing.png'} cannot be read" in line


def _image_tokens(record: Record) -> int:
    """Reads each image's header, as the real counter does (images.image_size)."""
    from PIL import Image

    return len(record.problem) + sum(Image.open(io.BytesIO(b)).size[0] for b in record.images)


def test_a_truncated_image_is_found_at_load_with_skip_and_named_when_drawn_with_fail(
    tmp_path: Path,
) -> None:
    """Its header reads, so a header check passes it: skip decodes every image at load;
    fail leaves it to the rank that decodes it, which names the row (a ConfigError: no
    restart would get past it)."""
    rows = [{"problem": f"q{i}", "answer": "1", "images": [{"bytes": _jpeg(i), "path": None}]}
            for i in range(3)]
    rows[1]["images"][0]["bytes"] = _jpeg(1)[: len(_jpeg(1)) // 2]
    f = _parquet(tmp_path / "t.parquet", rows)
    skip = DataConfig(train_files=["x"], bad_rows="skip")
    assert [r.row for r in PromptDataset([str(f)], skip, prompt_tokens=_image_tokens).records] \
        == [0, 2]
    ds = PromptDataset([str(f)], DataConfig(train_files=["x"]), prompt_tokens=_image_tokens)
    assert len(ds) == 3

    def decode(record: Record) -> int:
        from grpo_trainer.data import decode_images

        return len(decode_images(record.images))

    with pytest.raises(ConfigError, match=rf"{f} row 1: it cannot be decoded \(image file is "
                                          "truncated"):
        encode_rows(decode, ds.records)


def test_lazy_lengths_decide_at_draw_and_a_resumed_loader_decides_the_same(
    tmp_path: Path,
) -> None:
    f = tmp_path / "l.jsonl"
    f.write_text("".join(json.dumps({"problem": "x" * (5 if i % 3 else 50), "answer": "a"})
                         + "\n" for i in range(30)))
    cfg = DataConfig(train_files=["x"], max_prompt_length=20, prompt_lengths="lazy")
    ds = PromptDataset([str(f)], cfg, prompt_tokens=_chars)
    assert ds.lazy and len(ds) == 30 and ds.most("images") is None  # nothing counted

    def loader() -> StatefulLoader:
        return StatefulLoader(ds, 4, seed=3, shuffle=True, check=DrawCheck(cfg, _chars))

    straight = loader()
    batches = [[r.row for r in straight.next_batch()] for _ in range(8)]
    assert all(len(b) == 4 and all(r % 3 for r in b) for b in batches)  # no long one drawn
    resumed = loader()
    for _ in range(3):
        resumed.next_batch()
    again = loader()
    again.load_state_dict(json.loads(json.dumps(resumed.state_dict())))
    assert [[r.row for r in again.next_batch()] for _ in range(5)] == batches[3:]
    with pytest.raises(ConfigError, match=r"l\.jsonl row 0: the prompt has 50 tokens"):
        fail = cfg.model_copy(update={"overlong_prompts": "fail"})
        StatefulLoader(ds, 4, seed=0, shuffle=False, check=DrawCheck(fail, _chars)).next_batch()


def test_a_large_pass_runs_in_chunks_with_the_same_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunk boundaries cut row groups and files anywhere: the counts are the same."""
    from grpo_trainer.dataset import lengths

    rows = [{"problem": "p" * (i % 17 + 1), "answer": "a"} for i in range(50)]
    a = _parquet(tmp_path / "a.parquet", rows, row_group_size=7)
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps(r) + "\n" for r in rows[:23]))
    cfg = DataConfig(train_files=["x"])
    whole = PromptDataset([str(a), str(b)], cfg, prompt_tokens=_chars)
    monkeypatch.setattr(lengths, "CHUNK_ROWS", 5)
    monkeypatch.setattr(index_mod, "CHUNK_ROWS", 5)
    chunked = PromptDataset([str(a), str(b)], cfg, prompt_tokens=_chars)
    assert (whole.index.tokens == chunked.index.tokens).all()
    assert [int(t) for t in chunked.index.tokens] == [len(r["problem"]) for r in rows + rows[:23]]
