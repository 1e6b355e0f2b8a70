"""`grpo plan` reads the job's model as the operator would: a local directory, a copy of
the claim (--model-root), or the hub with the token the operator's reader pod sends (a
hub on loopback here: tests never reach the internet). The command is run for real
(click's CliRunner), and what it prints is checked: the model source, every refusal's
peak and fix, and never the token."""

from __future__ import annotations

import copy
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpo_api.job import parse_spec
from grpo_api.model_config import hub_config_url, shape_fields
from grpo_api.model_config import main as reader_pod
from grpo_operator import hub_config
from grpo_operator.cli import cli

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
H100_7B = EXAMPLES / "grpojob-qwen25vl-7b-h100.yaml"
REPO = "acme/custom-vl-3b"  # a fine-tuned model under a name no table knows
TOKEN = "hf_secret_token_1234"

# A Qwen2.5-VL-3B config.json as transformers writes it (the fields that size it, and
# some that do not: the reads keep only the former).
CONFIG: dict[str, Any] = {
    "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "tie_word_embeddings": True, "image_token_id": 151655,
    "text_config": {
        "model_type": "qwen2_5_vl_text", "hidden_size": 2048, "intermediate_size": 11008,
        "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
        "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 128000,
        "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24],
                            "rope_theta": 1000000.0}},
    "vision_config": {
        "model_type": "qwen2_5_vl_vision", "depth": 32, "hidden_size": 1280,
        "intermediate_size": 3420, "hidden_act": "silu", "spatial_merge_size": 2,
        "out_hidden_size": 2048, "patch_size": 14, "temporal_patch_size": 2, "in_channels": 3},
}  # fmt: skip


def run(*args: str, **env: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def job_file(tmp_path: Path, model: dict[str, Any], hub: dict[str, Any] | None = None,
             **sections: dict[str, Any]) -> str:
    job = yaml.safe_load(H100_7B.read_text())
    job["spec"]["model"] = model
    if hub:
        job["spec"]["hub"] = hub
    for name, values in sections.items():
        job["spec"].setdefault(name, {}).update(values)
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(job))
    return str(f)


def write_model(directory: Path, config: dict[str, Any] = CONFIG) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def planned(out: str) -> dict[str, Any]:
    return dict(json.loads(out))


# --- A local directory, and a claim's copy below --model-root.


def test_plan_reads_a_model_directory_here(tmp_path: Path) -> None:
    model = write_model(tmp_path / "sft")
    code, out, err = run("plan", job_file(tmp_path, {"path": str(model)}), "-o", "json")
    assert code == 0, err
    plan = planned(out)
    assert plan["model"]["layers"] == 36
    assert plan["model"]["source"] == f"config.json ({model}/config.json)"


@pytest.mark.parametrize("layout", ["claim", "pods"])
def test_plan_reads_a_model_on_a_claim_from_its_copy_below_model_root(
        tmp_path: Path, layout: str) -> None:
    """The pods mount the claim at /models: --model-root holds the claim's files
    (/models/sft is DIR/sft), or the pods' filesystem (DIR/models/sft)."""
    root = tmp_path / "copy"
    write_model(root / "acme-sft" if layout == "claim" else root / "models" / "acme-sft")
    f = job_file(tmp_path, {"path": "/models/acme-sft", "claimName": "models"})
    code, out, err = run("plan", f, "-o", "json", "--model-root", str(root))
    assert code == 0, err
    where = "acme-sft" if layout == "claim" else "models/acme-sft"
    assert planned(out)["model"]["source"] == (
        "claim config.json (claim models:/models/acme-sft/config.json), read from "
        f"{root}/{where}/config.json")
    assert planned(out)["model"]["layers"] == 36


def test_a_claim_model_not_found_names_model_root_and_the_paths_looked_for(
        tmp_path: Path) -> None:
    f = job_file(tmp_path, {"path": "/models/acme-sft", "claimName": "models"})
    code, out, err = run("plan", f)
    assert code == 2 and not out
    assert "claim models:/models/acme-sft/config.json is on a claim grpo plan cannot mount " \
           "(/models/acme-sft is not a directory" in err
    assert "Fix: pass --model-root DIR, DIR holding a copy of claim models (config.json at " \
           "DIR/acme-sft/config.json); or set spec.model.shape" in err
    assert "put the model on a claim" not in err  # it is on one
    (tmp_path / "empty").mkdir()
    code, _, err = run("plan", f, "--model-root", str(tmp_path / "empty"))
    assert code == 2
    assert f"is not below --model-root {tmp_path}/empty ({tmp_path}/empty/acme-sft is not a " \
           f"directory" in err and f"{tmp_path}/empty/models/acme-sft is not a directory" in err
    assert f"Fix: copy claim models to --model-root (config.json at {tmp_path}/empty/acme-sft/" \
           "config.json)" in err


def test_a_known_model_on_a_claim_not_found_plans_from_the_table_and_says_so(
        tmp_path: Path) -> None:
    """As the operator plans it before its reader pod has read the claim."""
    f = job_file(tmp_path, {"path": "/models/Qwen2.5-VL-7B-Instruct", "claimName": "models"})
    code, out, err = run("plan", f, "-o", "json")
    assert code == 0, err
    assert planned(out)["model"]["source"].startswith("known table: qwen2.5-vl-7b (claim models:")
    assert "Warning: spec.model: claim models:/models/Qwen2.5-VL-7B-Instruct/config.json is on " \
           "a claim grpo plan cannot mount" in err and "pass --model-root DIR" in err


# --- The hub: the operator's GET, on loopback.


@dataclass
class Hub:
    """A hub's `resolve` endpoint for config.json files, which records each request's
    Authorization header and, with `token`, answers 401 to any other (a private repo)."""

    repos: dict[str, dict[str, Any]]
    token: str | None = None
    seen: list[tuple[str, str | None]] = field(default_factory=list)
    url: str = ""


@contextmanager
def serve(hub: Hub) -> Iterator[Hub]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def do_GET(self) -> None:
            auth = self.headers.get("Authorization")
            hub.seen.append((self.path, auth))
            repo = self.path.removesuffix("/resolve/main/config.json").lstrip("/")
            if hub.token and auth != f"Bearer {hub.token}":
                code, body = 401, b'{"error": "Invalid credentials in Authorization header"}'
            elif repo in hub.repos:
                code, body = 200, json.dumps(hub.repos[repo]).encode()
            else:
                code, body = 404, b'{"error": "Repository not found"}'
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub_config.forget()  # answers are cached by URL
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        hub_config.forget()


ONLINE = {"GRPO_PLAN_OFFLINE": "0"}  # the unit tier's conftest plans offline


def test_plan_reads_a_private_hub_repo_with_the_token_the_reader_pod_sends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve(Hub({REPO: CONFIG}, token=TOKEN)) as hub:
        f = job_file(tmp_path, {"path": REPO}, {"endpoint": hub.url, "tokenSecret": "hf"})
        code, out, err = run("plan", f, "-o", "json", **ONLINE, HF_TOKEN=TOKEN)
        assert code == 0, err
        url = hub_config_url(hub.url, REPO, None)
        assert planned(out)["model"]["source"] == f"hub config.json ({url})"
        assert planned(out)["model"]["layers"] == 36
        printed = out + err
        hub_config.forget()  # the answer is cached: ask again, with the option's token
        code, out, err = run("plan", f, "-o", "yaml", "--hub-token", TOKEN, **ONLINE)
        assert code == 0 and yaml.safe_load(out)["model"]["source"] == f"hub config.json ({url})"
        printed += out + err
        # The operator's reader pod (python -m grpo_api.model_config, HF_TOKEN from the
        # job's Secret) asks the same URL with the same header.
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        assert reader_pod(["--url", url, "--out", str(tmp_path / "termination-log")]) == 0
    assert [s for s in hub.seen if s[1]] == [(f"/{REPO}/resolve/main/config.json",
                                              f"Bearer {TOKEN}")] * 3
    assert TOKEN not in printed


def test_a_private_repo_without_the_token_is_refused_naming_the_option(tmp_path: Path) -> None:
    with serve(Hub({REPO: CONFIG}, token=TOKEN)) as hub:
        f = job_file(tmp_path, {"path": REPO}, {"endpoint": hub.url, "tokenSecret": "hf"})
        code, out, err = run("plan", f, **ONLINE, HF_TOKEN="")
        assert code == 2 and not out
        assert "HTTP 401" in err and "is not a model the known table has" in err
        assert "Fix: spec.hub.tokenSecret is set: give grpo plan the same token with " \
               "--hub-token or HF_TOKEN" in err
        code, out, err = run("plan", f, "--hub-token", "hf_wrong_token_5678", **ONLINE)
        assert code == 2 and "HTTP 401" in err and "check the token of --hub-token" in err
        assert "hf_wrong_token_5678" not in out + err


def test_a_public_repo_is_read_without_the_users_token_as_the_operator_reads_it(
        tmp_path: Path) -> None:
    """No spec.hub.tokenSecret: the operator GETs config.json itself, without a token."""
    with serve(Hub({REPO: CONFIG})) as hub:
        f = job_file(tmp_path, {"path": REPO}, {"endpoint": hub.url})
        code, _, err = run("plan", f, "-o", "json", **ONLINE, HF_TOKEN=TOKEN)
        assert code == 0, err
    assert hub.seen == [(f"/{REPO}/resolve/main/config.json", None)]


def test_a_hub_named_as_the_cluster_names_it_is_read_from_the_list_given(
        tmp_path: Path) -> None:
    """spec.hub.endpoint: mirror (the chart's hubEndpoints): grpo plan reads the URL that
    --hub-endpoints gives that name; without it, it says how to give it."""
    with serve(Hub({REPO: CONFIG})) as hub:
        f = job_file(tmp_path, {"path": REPO}, {"endpoint": "mirror"})
        code, out, err = run("plan", f, "-o", "json", "--hub-endpoints",
                             json.dumps({"mirror": hub.url}), **ONLINE)
        assert code == 0, err
        assert planned(out)["model"]["source"] == \
            f"hub config.json ({hub_config_url(hub.url, REPO, None)})"
        code, _, err = run("plan", f, **ONLINE)
        assert code == 2
        assert "spec.hub.endpoint: 'mirror' names one of a cluster's hub endpoints" in err
        assert "--hub-endpoints" in err
        code, _, err = run("plan", f, "--hub-endpoints", "{mirror}", **ONLINE)
        assert code == 2 and "--hub-endpoints: not JSON" in err
    assert hub.seen == [(f"/{REPO}/resolve/main/config.json", None)]


def test_offline_plans_a_known_hub_model_from_the_table_and_refuses_another(
        tmp_path: Path) -> None:
    with serve(Hub({REPO: CONFIG})) as hub:
        known = job_file(tmp_path, {"path": "Qwen/Qwen2.5-VL-7B-Instruct"},
                         {"endpoint": hub.url})
        code, out, err = run("plan", known, "-o", "json", "--offline", **ONLINE)
        assert code == 0, err
        url = hub_config_url(hub.url, "Qwen/Qwen2.5-VL-7B-Instruct", None)
        assert planned(out)["model"]["source"] == f"known table: qwen2.5-vl-7b ({url} not read " \
                                              "(--offline))"
        assert "Warning: spec.model:" in err and "run without --offline" in err
        code, out, err = run("plan", job_file(tmp_path, {"path": REPO}, {"endpoint": hub.url}))
        assert code == 2 and f"{hub_config_url(hub.url, REPO, None)} not read (--offline)" in err
        assert "set spec.model.shape" in err
    assert hub.seen == []  # the conftest's GRPO_PLAN_OFFLINE, and --offline: no request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_hub_is_refused_with_the_url_and_the_fixes(tmp_path: Path) -> None:
    hub_config.forget()
    f = job_file(tmp_path, {"path": REPO}, {"endpoint": f"http://127.0.0.1:{free_port()}"})
    code, _, err = run("plan", f, **ONLINE)
    assert code == 2 and "hub config.json unreadable: GET http://127.0.0.1:" in err
    assert "Fix: reach the hub from here (spec.hub.endpoint names a mirror), plan as an " \
           "operator that cannot reach it with --offline, or set spec.model.shape" in err
    hub_config.forget()


# --- The context against the model's positions.


def test_the_read_keeps_the_positions_and_a_rope_scaling_that_extends_them() -> None:
    """What sizes the context travels with the shape fields (status.modelConfig, the
    reader pod's report); rope settings that do not extend it (mrope sections, theta)
    stay behind."""
    fields = shape_fields(CONFIG)
    assert fields["text_config"]["max_position_embeddings"] == 128000
    assert "rope_parameters" not in fields["text_config"]
    yarn = shape_fields(with_rope(4.0, 32768))["text_config"]
    assert yarn["rope_scaling"] == {"type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 32768}


def long_context(tmp_path: Path, config: dict[str, Any]) -> str:
    model = write_model(tmp_path / "long", config)
    return job_file(tmp_path, {"path": str(model)},
                    data={"maxPromptLength": 131072, "maxResponseLength": 68928})


def test_a_context_beyond_the_models_positions_is_refused_naming_the_fields_and_limit(
        tmp_path: Path) -> None:
    code, out, err = run("plan", long_context(tmp_path, CONFIG))
    assert code == 2 and not out
    assert ("spec.data.maxPromptLength + spec.data.maxResponseLength: 131072 + 68928 = 200000 "
            "tokens, more than the 128000 positions of the model (max_position_embeddings "
            f"128000 in config.json ({tmp_path}/long/config.json))") in err
    assert "Fix: lower them to at most 128000 together, e.g. spec.data.maxPromptLength: " in err


def with_rope(factor: float, original: int | None) -> dict[str, Any]:
    config = copy.deepcopy(CONFIG)
    config["text_config"]["max_position_embeddings"] = 32768
    config["text_config"]["rope_scaling"] = {
        "type": "yarn", "factor": factor,
        **({"original_max_position_embeddings": original} if original else {})}
    return config


def test_a_rope_scaling_extends_the_positions_and_the_plan_says_what_it_assumed(
        tmp_path: Path) -> None:
    """YaRN x 4 of 32768: 131072 positions by the longest reading; 200000 is beyond every
    reading (refused), 65536 within (planned, the assumption stated)."""
    code, _, err = run("plan", long_context(tmp_path, with_rope(4.0, 32768)))
    assert code == 2
    assert "more than the 131072 positions of the model (max_position_embeddings 32768 in " \
           "config.json" in err
    assert "rope scaling yarn (factor 4) extends it to original_max_position_embeddings " \
           "32768 x 4 = 131072, assumed" in err
    f = job_file(tmp_path, {"path": str(tmp_path / "long")},
                 data={"maxPromptLength": 32768, "maxResponseLength": 32768})
    code, out, err = run("plan", f, "-o", "json")
    assert code == 0, err
    context = next(d for d in planned(out)["decisions"] if d["knob"] == "context")
    assert context["value"] == "65536 of 131072"
    assert "assumed" in context["reason"]


# --- Suggestions by cost, and the host memory refusal.


def spec_with(path: Path, **sections: dict[str, Any]) -> Any:
    doc = yaml.safe_load(path.read_text())["spec"]
    for name, values in sections.items():
        doc.setdefault(name, {}).update(values)
    return parse_spec(doc)


A100 = EXAMPLES / "grpojob-qwen25vl-7b-a100-40gb.yaml"


def test_a_pinned_utilisation_that_does_not_fit_is_first_offered_the_highest_that_does() -> None:
    """The user's case: 0.90 pinned on 8 A100s whose nodes give 100 GiB; it was offered
    'bf16 on 32 GPUs' first."""
    from grpo_operator.planner import InfeasibleError, plan_memory

    memory = {"rolloutGpuMemoryUtilization": 0.9}
    with pytest.raises(InfeasibleError) as err:
        plan_memory(spec_with(A100, memory=memory, resources={"hostMemory": "100Gi"}))
    first = err.value.suggestions[0]
    assert first.startswith("memory.rolloutGpuMemoryUtilization: 0.57 instead of 0.90 (the "
                            "highest that fits; GPU rollout peak "), first
    assert err.value.suggestions[1] == ("unset memory.rolloutGpuMemoryUtilization (let the "
                                        "planner choose)")
    mode = next(i for i, s in enumerate(err.value.suggestions) if "training fits" in s)
    assert mode > 2  # another mode after the user's knob and the hardware
    fits = plan_memory(spec_with(A100, memory={"rolloutGpuMemoryUtilization": 0.57},
                                 resources={"hostMemory": "100Gi"}))
    assert fits.settings.rollout_gpu_memory_utilization == 0.57
    with pytest.raises(InfeasibleError):  # and it is the highest
        plan_memory(spec_with(A100, memory={"rolloutGpuMemoryUtilization": 0.58},
                              resources={"hostMemory": "100Gi"}))


def test_too_little_host_memory_quotes_the_peak_it_compares_and_the_host_memory_that_fits(
        ) -> None:
    from grpo_operator.planner import InfeasibleError, plan_memory

    with pytest.raises(InfeasibleError) as err:
        plan_memory(spec_with(H100_7B, resources={"hostMemory": "32Gi"}))
    e = err.value
    assert e.summary.endswith("does not fit in host memory: the settings that fit its GPUs "
                              "need more than the nodes give")
    # Quoted: the cheapest settings whose GPUs fit (no offload), not the safest (whose
    # offloaded state would need ~178 GiB of host RAM).
    assert e.numbers[0].startswith("quoted: the cheapest settings whose GPUs fit "
                                   "(gradientCheckpointing true, microBatchTokens ")
    assert "offload nothing" in e.numbers[0]
    peak = next(n for n in e.numbers if n.startswith("host peak"))
    assert peak.endswith("GiB per node (while loading) > 27.4 GiB usable"), peak
    assert any(n.startswith("largest host terms (while loading): rank0_full_model_fp32 ")
               for n in e.numbers)
    assert ("host usable per node: 32.0 GiB (resources.hostMemory) x 0.95 allocatable x 0.90 "
            "headroom (Ray kills at 95%) = 27.4 GiB") in e.numbers
    fix = e.suggestions[0]
    assert fix.startswith("resources.hostMemory: 76Gi instead of 32Gi (the least that fits; "
                          "H100-80GB nodes have 2048 GiB;"), fix
    assert plan_memory(spec_with(H100_7B, resources={"hostMemory": "76Gi"})).budget.fits
    with pytest.raises(InfeasibleError):
        plan_memory(spec_with(H100_7B, resources={"hostMemory": "75Gi"}))


def test_the_cli_prints_the_host_refusal_with_its_peak_and_fix(tmp_path: Path) -> None:
    job = yaml.safe_load(H100_7B.read_text())
    job["spec"]["resources"]["hostMemory"] = "32Gi"
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(job))
    code, out, err = run("plan", str(f))
    assert code == 2 and not out
    assert "host peak" in err and "(while loading) > 27.4 GiB usable" in err
    assert "smallest changes that would fit:\n  - resources.hostMemory: 76Gi instead of 32Gi" \
           in err


def test_a_batch_that_does_not_split_evenly_is_refused_with_the_sizes_that_do() -> None:
    from grpo_operator.planner import InfeasibleError, plan_memory

    with pytest.raises(InfeasibleError) as err:
        plan_memory(spec_with(H100_7B, training={"globalBatchSize": 20}))
    assert str(err.value).endswith("Fix: training.globalBatchSize: 24 or 16, or a world size "
                                   "that divides it")
