"""The operator's scale curve (``bench_operator.py --jobs 50,200,1000 --json F --plot P``):
per count, Running p99 beside KubeRay's, the operator's memory and CPU per job, and its
reconcile time. Growth that is linear or better shows as flat or falling per-job lines.

    .venv/bin/python bench/plot_scale.py bench/plots/operator_scale.jsonl \\
        bench/plots/operator_scale.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def per_job(r: dict[str, Any]) -> dict[str, float]:
    """One count's figures, per job where the curve asks for it."""
    jobs = r["jobs"]
    return {
        "running_p99_ours": r["ours"]["running_p99"],
        "running_p99_base": r["base"]["running_p99"],
        "rss_kib_per_job": (r["rss_mib"] - r["idle_rss_mib"]) * 1024 / jobs,
        "cpu_ms_per_job": r["cpu_s"] * 1000 / jobs,
        "reconcile_p50_ms": r["reconcile_p50_s"] * 1000,
        "reconcile_p99_ms": r["reconcile_p99_s"] * 1000,
    }


def plot_scale(results: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a CI machine
    import matplotlib.pyplot as plt

    runs = sorted(results, key=lambda r: r["jobs"])
    x = [r["jobs"] for r in runs]
    rows = [per_job(r) for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (
        ("Running p99 (s)", (("running_p99_ours", "GRPOJob (ours)"),
                             ("running_p99_base", "RayJob (KubeRay)"))),
        ("operator, per job", (("rss_kib_per_job", "RSS above idle (KiB)"),
                               ("cpu_ms_per_job", "CPU (ms)"))),
        ("reconcile (ms)", (("reconcile_p50_ms", "p50"), ("reconcile_p99_ms", "p99"))),
    )
    for ax, (title, series) in zip(axes, panels, strict=True):
        for key, label in series:
            ax.plot(x, [row[key] for row in rows], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_xticks(x, [str(j) for j in x])
        ax.set_xlabel("jobs created at once")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle(f"bench_operator.py, {runs[-1]['order']}, {runs[-1]['finished']}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    plot_scale([json.loads(line) for line in src.read_text().splitlines()], dst)
