"""Video micro-batches on FSDP2 ranks (vision_in_step.py, ``tower_passes``): a rank whose
micro-batch has images and videos (the tower runs twice) beside a text-only rank (twice
with the zero image). The rank function (spawned ranks import it by name) and the
one-process reference. Used by tests/trainer/test_videos.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpo_trainer.algorithm.samples import PromptEncoder, Sample, TrainBatch, collate_train
from grpo_trainer.data import Record, load_template

from .datasets import png
from .lean_check import run
from .video_files import frame_list


def batches(model_dir: Path) -> list[TrainBatch]:
    """[image + video micro-batch, text-only micro-batch] of the tiny VLM (videos as frame
    lists: no file to share between processes)."""
    from transformers import AutoProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = PromptEncoder(AutoProcessor.from_pretrained(model_dir), tok, load_template("math"),
                        None)
    vision = [enc.encode(Record(0, "<video>What happens?", "1",
                                videos=[frame_list(4, (56, 56))])),
              enc.encode(Record(1, "<image><video>Which?", "2",
                                images=[png((200, 30, 30), (44, 36))],
                                videos=[frame_list(3, (40, 56))]))]
    text = [enc.encode(Record(2, "Say the number 7 please", "7")),
            enc.encode(Record(3, "Count to three, slowly.", "3"))]
    gen = torch.Generator().manual_seed(0)

    def samples(prompts: list[Any]) -> list[Sample]:
        return [Sample(p, torch.randint(10, 300, (n,), generator=gen), torch.zeros(n), True)
                for p, ns in zip(prompts, [[5, 1], [3, 8]], strict=True) for n in ns]

    pad = int(tok.pad_token_id)
    out = [collate_train(samples(vision), pad), collate_train(samples(text), pad)]
    assert {"pixel_values", "pixel_values_videos"} <= out[0].model_inputs.keys()
    assert "pixel_values_videos" not in out[1].model_inputs
    return out


def video_rank(rank: int, world: int, arg: dict[str, Any]) -> dict[str, Any]:
    """Rank r takes micro-batch r of ``batches`` under FSDP2 with the tower run twice a
    forward; returns its log-probs (actor and reference) and every full gradient."""
    from grpo_api.trainer_config import ActorConfig, ModelConfig
    from grpo_trainer.model.modeling import load_full, shard_model
    from grpo_trainer.model.vision_in_step import tower_passes

    cfg = ActorConfig(dtype="float32", reshard_after_forward=True)
    cpu = torch.device("cpu")
    mcfg = ModelConfig(path=arg["model"])
    passes = tower_passes(1)
    actor = shard_model(load_full(mcfg, torch.float32), cfg, cpu, trainable=True,
                        tower_passes=passes)
    ref = shard_model(load_full(mcfg, torch.float32), cfg, cpu, trainable=False,
                      tower_passes=passes)
    batch = batches(Path(arg["model"]))[rank]
    with torch.no_grad():
        ref_logp, _ = run(ref, batch, lean=True, grad=False)
    logp, grads = run(actor, batch, lean=True)
    full = {n: g.full_tensor() if hasattr(g, "full_tensor") else g for n, g in grads.items()}
    return {"ref": ref_logp, "logp": logp, "grads": full}


def one_process_reference(model_dir: Path) -> dict[str, Any]:
    """The same passes without FSDP in one process (mixed_check's, on these batches)."""
    from .mixed_check import one_process_reference as reference

    return reference(model_dir, batches)
