"""Prompt data: EasyR1 columns, images as bytes or paths, templates, a resumable loader."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from grpo_api.trainer_config import DataConfig
from grpo_trainer.config_error import ConfigError
from grpo_trainer.data import Record, build_messages, load_template
from grpo_trainer.dataset import PromptDataset, StatefulLoader

pytestmark = pytest.mark.unit


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parquet_with_image_bytes_and_jsonl_with_image_paths(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    png = _png()
    pq.write_table(pa.table({"problem": ["<image>count"], "answer": ["1"],
                             "images": [[{"bytes": png, "path": None}]]}), tmp_path / "a.parquet")
    (tmp_path / "img.png").write_bytes(png)
    _jsonl(tmp_path / "b.jsonl", [{"problem": "look", "answer": "2", "images": ["img.png"]}])
    ds = PromptDataset([str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl")],
                       DataConfig(train_files=["x"]))
    assert [r.images for r in ds.records] == [[png], [png]]
    assert [r.answer for r in ds.records] == ["1", "2"]


def test_missing_column_is_a_config_error(tmp_path: Path) -> None:
    """A jsonl row without the prompt is a bad row, named; a parquet file without the
    column is the file's fault, named with the columns it has."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = _jsonl(tmp_path / "a.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(ConfigError) as err:
        PromptDataset([str(f)], DataConfig(train_files=[str(f)]))
    assert err.value.field == "data.bad_rows"
    assert f"{f} row 0: no prompt (column 'problem' is missing or null)" in str(err.value)
    pq.write_table(pa.table({"question": ["q"], "answer": ["a"]}), tmp_path / "b.parquet")
    with pytest.raises(ConfigError) as err:
        PromptDataset([str(tmp_path / "b.parquet")], DataConfig(train_files=["x"]))
    assert err.value.field == "data.prompt_key"
    assert "has no column 'problem' (its columns: question, answer)" in str(err.value)


def test_math_template_and_image_markers() -> None:
    from grpo_trainer.data import Record

    tpl = load_template("math")
    rec = Record(0, "Here <image> and <image> differ?", "2", images=[b"a", b"b"])
    content = build_messages(rec, tpl)[0]["content"]
    assert [c["type"] for c in content] == ["text", "image", "text", "image", "text"]
    assert "\\boxed{}" in content[-1]["text"] and "<think>" in content[-1]["text"]
    plain = build_messages(Record(1, "  hi ", "x"), load_template("plain"))
    assert plain == [{"role": "user", "content": "hi"}]


def test_loader_is_seeded_and_resumes_mid_epoch(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "a.jsonl", [{"problem": f"p{i}", "answer": "a"} for i in range(10)])
    ds = PromptDataset([str(f)], DataConfig(train_files=[str(f)]))
    a = StatefulLoader(ds, 3, seed=7, shuffle=True)
    straight = [[r.index for r in a.next_batch()] for _ in range(7)]
    b = StatefulLoader(ds, 3, seed=7, shuffle=True)
    first = [[r.index for r in b.next_batch()] for _ in range(4)]
    state = json.loads(json.dumps(b.state_dict()))  # survives serialisation
    c = StatefulLoader(ds, 3, seed=7, shuffle=True)
    c.load_state_dict(state)
    rest = [[r.index for r in c.next_batch()] for _ in range(3)]
    assert first + rest == straight
    # Each epoch covers distinct prompts; epochs are reshuffled.
    assert len({i for batch in straight[:3] for i in batch}) == 9
    assert straight[:3] != straight[3:6]


def test_batch_larger_than_dataset_is_rejected(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "a.jsonl", [{"problem": "p", "answer": "a"}])
    ds = PromptDataset([str(f)], DataConfig(train_files=[str(f)]))
    with pytest.raises(ConfigError) as err:
        StatefulLoader(ds, 2, seed=0, shuffle=False)
    assert err.value.field == "trainer.rollout_batch_size"


def _rows(tmp_path: Path) -> tuple[Path, Path]:
    a = _jsonl(tmp_path / "a.jsonl", [{"problem": "x" * n, "answer": "1"} for n in (5, 40, 9)])
    b = _jsonl(tmp_path / "b.jsonl", [{"problem": "y" * n, "answer": "2"} for n in (50, 7)])
    return a, b


def _chars(record: Record) -> int:
    """A stand-in tokenizer for the policy: one token per character."""
    return len(record.problem)


def test_overlong_prompts_are_dropped_by_default_and_each_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """EasyR1's filter_overlong_prompts: a prompt longer than data.max_prompt_length is left
    out when the data is loaded; the log names its file, its row, both lengths and the
    settings (with the GRPOJob fields that set them)."""
    a, b = _rows(tmp_path)
    cfg = DataConfig(train_files=["x"], max_prompt_length=30)
    ds = PromptDataset([str(a), str(b)], cfg, prompt_tokens=_chars)
    assert [(r.index, r.source, r.row) for r in ds.records] == [
        (0, str(a), 0), (2, str(a), 2), (4, str(b), 1)]
    (line,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert line.startswith("dropped 2 of 5 prompts of data.train_files (data.overlong_prompts "
                           "(spec.data.overlongPrompts): drop): ")
    assert (f"{a} row 1: the prompt has 40 tokens, more than the 30 of data.max_prompt_length "
            "(spec.data.maxPromptLength)") in line
    assert f"{b} row 0: the prompt has 50 tokens" in line


def test_overlong_prompts_fail_the_run_when_asked_naming_the_row_and_the_fix(
    tmp_path: Path,
) -> None:
    a, b = _rows(tmp_path)
    cfg = DataConfig(train_files=["x"], max_prompt_length=30, overlong_prompts="fail")
    with pytest.raises(ConfigError) as err:
        PromptDataset([str(a), str(b)], cfg, prompt_tokens=_chars)
    assert err.value.field == "data.max_prompt_length"
    assert str(err.value) == (
        f"data.max_prompt_length: {a} row 1: the prompt has 40 tokens, more than the 30 of "
        "data.max_prompt_length (spec.data.maxPromptLength); raise it, or set "
        "data.overlong_prompts (spec.data.overlongPrompts) to drop to leave such prompts out")
    # Every prompt fits: both settings keep them all.
    assert len(PromptDataset([str(a), str(b)], cfg.model_copy(update={"max_prompt_length": 50}),
                             prompt_tokens=_chars)) == 5


def test_a_dataset_of_only_overlong_prompts_is_a_config_error(tmp_path: Path) -> None:
    a, _ = _rows(tmp_path)
    with pytest.raises(ConfigError, match=r"every prompt is too long: .*a\.jsonl row 0"):
        PromptDataset([str(a)], DataConfig(train_files=["x"], max_prompt_length=4),
                      "data.val_files", prompt_tokens=_chars)


def test_an_image_no_resize_accepts_is_named_with_its_row(tmp_path: Path) -> None:
    a, _ = _rows(tmp_path)

    def refuse(record: Record) -> int:
        raise ValueError("absolute aspect ratio must be smaller than 200, got 250.0")

    with pytest.raises(ConfigError,
                       match=r"a\.jsonl row 0: it cannot be encoded \(absolute aspect"):
        PromptDataset([str(a)], DataConfig(train_files=["x"]), prompt_tokens=refuse)


def test_the_overlong_setting_accepts_drop_and_fail_only() -> None:
    with pytest.raises(ValueError, match=r"overlong_prompts\n  Input should be 'drop' or 'fail'"):
        DataConfig(train_files=["x"], overlong_prompts="skip")  # type: ignore[arg-type]


def test_one_file_may_be_written_as_easyr1_writes_it() -> None:
    """EasyR1's data.train_files is one string: the same config reads here as a list of one,
    and a list is kept as written."""
    one = DataConfig.model_validate({"train_files": "/data/train.parquet",
                                     "val_files": "/data/val.parquet"})
    assert one.train_files == ["/data/train.parquet"] and one.val_files == ["/data/val.parquet"]
    two = DataConfig(train_files=["/a.parquet", "/b.jsonl"])
    assert two.train_files == ["/a.parquet", "/b.jsonl"] and two.val_files == []
    with pytest.raises(ValueError, match="train_files"):
        DataConfig.model_validate({"train_files": []})
