"""Planned against measured for ``bench/gpu_fidelity.py``: the comparison and the table.

``compare`` puts one case's marks and tensor counts (grpo_testkit.fidelity)
beside its plan's GPU terms, in GiB: per stage (load, training) and per component of
the training stage, the components named by the planner's state-term kinds
(planner/modes.py), so a new term is compared without a change here.
"""

from __future__ import annotations

from typing import Any

GIB = 2**30
TOLERANCE = 0.15  # a stage or component further off than this: correct the planner

TRANSIENT_TERMS = ("all_gather_units_bf16", "activations", "logits")  # estimates


def _gib(b: float | None) -> float | None:
    return None if b is None else b / GIB


def _stage_marks(marks: list[dict[str, Any]], steps: int) -> dict[str, list[dict[str, Any]]]:
    """The marks whose peaks make each stage: load (actor, reference) and training (the
    last complete step: backward, optimizer step, rest; or where it ran out of memory)."""
    last = [f"step{steps}:{p}" for p in ("backward", "optimizer", "end")]
    out = {
        "load": [m for m in marks if m["name"].startswith("load:")],
        "training": [m for m in marks if m["name"] in last],
    }
    if marks and marks[-1]["name"] == "oom":
        stage = "load" if not any(m["name"].startswith("step") for m in marks) else "training"
        out[stage].append(marks[-1])
    return out


def _peak(marks: list[dict[str, Any]], key: str) -> float | None:
    values = [m[key] for m in marks if m.get(key) is not None]
    return max(values) if values else None


def compare(plan: Any, result: dict[str, Any], cuda: bool, steps: int) -> dict[str, Any]:
    """Planned against measured, GiB: per stage, and per component of the training stage."""
    from grpo_operator.planner.modes import STATE

    budget, mode = plan.budget, plan.geometry.mode(plan.settings)
    marks = result.get("marks", [])
    context = _gib(_peak(marks, "non_torch")) if cuda else None
    stages = []
    for name, stage_marks in _stage_marks(marks, steps).items():
        terms = budget.gpu_stages.get(name, {})
        allocated = _gib(_peak(stage_marks, "peak_allocated"))
        # Like for like. On a GPU: the allocator's peak plus the memory outside it against
        # every planned term. On a CPU the marks see the live tensors between forward
        # passes: against the planned state alone (no context, no transient estimates).
        measured = None if allocated is None else allocated + (context or 0.0)
        left_out = () if cuda else ("cuda_context", *TRANSIENT_TERMS)
        planned = sum(v for k, v in terms.items() if k not in left_out)
        stages.append({
            "stage": name, "planned": planned, "planned_total": sum(terms.values()),
            "measured": measured,
            "reserved": _gib(_peak(stage_marks, "peak_reserved")),
            "device": _gib(_peak(stage_marks, "device_peak")),
            "ratio": None if measured is None or not planned else measured / planned,
        })
    training = budget.gpu_stages.get("training", {})
    comps = result.get("components", {})
    where = "cuda" if cuda else "cpu"

    def measured_of(role: str) -> float | None:
        return _gib(comps[role].get(where, 0)) if role in comps else None

    rows = []
    for kind in ("weights", "frozen", "grads", "optimizer"):
        terms = [t.name for t in STATE[mode] if t.kind == kind]
        if terms:
            rows.append((kind, terms, measured_of(kind)))
    rows.append(("reference_model", ["reference_model_shard"],
                 measured_of("reference_model") if "reference_model" in comps
                 else (0.0 if "weights" in comps else None)))
    if cuda:
        rows.append(("cuda_context", ["cuda_context"], context))
        start = next((m for m in marks if m["name"] == f"step{steps}:start"), None)
        backward = next((m for m in marks if m["name"] == f"step{steps}:backward"), None)
        grads = measured_of("grads") or 0.0
        transient = (
            (backward["peak_allocated"] - start["allocated"]) / GIB - grads
            if start and backward else None
        )
        rows.append(("transient (estimate)", list(TRANSIENT_TERMS), transient))
    components = []
    for role, terms, measured in rows:
        planned = sum(training.get(t, 0.0) for t in terms)
        components.append({
            "component": role, "terms": terms, "planned": planned, "measured": measured,
            "ratio": None if measured is None or not planned else measured / planned,
        })
    host_opt = comps.get("optimizer", {}).get("cpu") if cuda else None
    return {"stages": stages, "components": components,
            "optimizer_on_host": _gib(host_opt) if host_opt else None}


def _f(x: float | None, scale: float, width: int = 8) -> str:
    return f"{x * scale:{width}.2f}" if x is not None else f"{'-':>{width}}"


def _flag(ratio: float | None) -> str:
    return " !" if ratio is not None and abs(ratio - 1) > TOLERANCE else ""


def settings_line(plan: Any) -> str:
    s = plan.settings
    off = [n for n, on in (("params", s.offload_params), ("optimizer", s.offload_optimizer)) if on]
    return (f"micro-batch {s.micro_batch_size}, "
            f"checkpointing {'on' if s.gradient_checkpointing else 'off'}, "
            f"offload {'+'.join(off) or 'none'}, init {'rank0' if s.rank0_init else 'sharded'}")


def _unit(cases: list[dict[str, Any]]) -> tuple[str, float]:
    """GiB, or MiB when every state component is small (the tiny smoke run)."""
    state = [co["planned"] for c in cases for co in c.get("comparison", {}).get("components", [])
             if co["component"] != "cuda_context"]
    return ("GiB", 1.0) if max(state, default=1.0) >= 0.5 else ("MiB", 1024.0)


def print_report(report: dict[str, Any]) -> None:
    env, gpu = report["environment"], report["environment"].get("gpu") or {}
    unit, k = _unit(report["cases"])
    print(f"\nGPU fidelity on {gpu.get('name', env['device'])} (driver {gpu.get('driver', '-')}, "
          f"torch {env['torch']}, transformers {env['transformers']}); planned for "
          f"{env['gpu_type']} with {env['host_gib']} GiB host RAM; {unit}; "
          f"'!' = more than {TOLERANCE:.0%} off")
    for c in report["cases"]:
        head = f"\n{c['case']} ({c.get('mode', '-')})"
        if c.get("skipped"):
            planned = f" ({c['settings']})" if c.get("settings") else ""
            print(f"{head}: skipped{planned}: {c['skipped']}")
            continue
        print(f"{head}: {c['settings']}; {c.get('seconds') or 0.0:.0f} s")
        if c.get("error"):
            print(f"  ERROR {c['error']['kind']}: {c['error']['message'].strip()[-600:]}")
        cmp = c.get("comparison")
        if not cmp:
            continue
        print(f"  {'stage':<24}{'planned':>8}{'measured':>9}{'reserved':>9}{'device':>8}"
              f"{'ratio':>8}")
        for ph in cmp["stages"]:
            print(f"  {ph['stage']:<24}{_f(ph['planned'], k)}{_f(ph['measured'], k, 9)}"
                  f"{_f(ph['reserved'], k, 9)}{_f(ph['device'], k)}{_f(ph['ratio'], 1)}"
                  f"{_flag(ph['ratio'])}")
        for co in cmp["components"]:
            print(f"    {co['component']:<22}{_f(co['planned'], k)}{_f(co['measured'], k, 9)}"
                  f"{'':>17}{_f(co['ratio'], 1)}{_flag(co['ratio'])}")
        if cmp.get("optimizer_on_host"):
            print(f"    optimizer state on the host: {cmp['optimizer_on_host'] * k:.2f} {unit}")
        _print_host_and_rates(c, env["gpu_type"], unit, k)


def _print_host_and_rates(c: dict[str, Any], gpu_type: str, unit: str, k: float) -> None:
    host, r = c.get("host") or {}, c.get("rates")
    if host:
        print(f"  host: RSS peak {_f(host['rss_peak'], k, 0)} {unit} against the rank's "
              f"planned {_f(host['planned_rank'], k, 0)} {unit} ("
              + ", ".join(f"{n} {v * k:.2f}" for n, v in host["planned_terms"].items() if v)
              + f"); pinned peak {_f(host['pinned_peak'], k, 0)} {unit} against "
              f"{_f(host['planned_pinned'], k, 0)} planned"
              + (f"; {host['host_allocs']:.0f} cudaHostAlloc, {host['host_alloc_ms']:.0f} ms"
                 if host.get("host_allocs") is not None else ""))
    if r:
        mfu = f"MFU {r['mfu']:.1%} of {r['peak_tflops']:.0f} TFLOP/s dense bf16 ({gpu_type})" \
            if r.get("mfu") is not None else f"no bf16 peak known for {gpu_type}"
        print(f"  update (step {r['step']}): {r['tokens_per_s']:.0f} tokens/s, "
              f"{r['tflops']:.1f} TFLOP/s, {mfu}")
