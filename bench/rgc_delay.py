"""docs/rgc.md, "The delay decided": the running-ahead delays of the executors' whole-backward
rule against a per-hop rule, and what each holds in memory
(:mod:`lmrepro.rgc.analysis.byte_account`), at the benchmark's shape (``rgc.json``) and the paper's
(``rgc_paper_shape.json``) on its own 4-worker placement. Pure arithmetic from the configurations.
Called by make_performance_doc.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmrepro.rgc.analysis import byte_account as ba
from lmrepro.rgc.config import RGCConfig

MIB = 2**20


def configs(bench: dict[str, Any] | None, paper: dict[str, Any] | None
            ) -> list[tuple[str, RGCConfig]]:
    """The configurations compared, running ahead by one step (s = 1): the benchmark's at
    H = 2 (its `async-H2-stale1` run), the paper shape on its 2-worker benchmark placement and on
    the paper's 4 workers of one stage at H = 2, 3 and 4."""
    out: list[tuple[str, RGCConfig]] = []
    common = {"consensus_staleness": 1, "steps": 100, "cores": None}
    if bench is not None:
        out.append(("benchmark", RGCConfig(**{**bench["config"], **common, "horizon": 2})))
    if paper is not None:
        base = {**paper["config"], **common}
        out.append(("paper shape", RGCConfig(**{**base, "horizon": 2})))
        for h in (2, 3, 4):
            out.append(("paper shape", RGCConfig(**{**base, "horizon": h, "threads": None,
                                                    "stages_per_worker": [1, 1, 1, 1]})))
    return out


def _workers_bytes(acc: dict[str, Any], kind: str | None = None) -> int:
    return sum(int(w["total"] if kind is None else w["bytes"][kind]) for w in acc["workers"])


def rows(bench: dict[str, Any] | None, paper: dict[str, Any] | None) -> list[list[str]]:
    """One row per configuration: delays and the workers' bytes under each rule."""
    out = []
    for name, cfg in configs(bench, paper):
        whole, hop = ba.async_account(cfg), ba.async_account(cfg, delay_rule="per_hop")
        m = cfg.model
        d = _workers_bytes(whole) - _workers_bytes(hop)
        saved = [(_workers_bytes(whole, k) - _workers_bytes(hop, k)) / MIB
                 for k in ("activations_kept", "stashed_weights")]
        out.append([f"{name} ({m.n_layers}x{m.d_model}, M = {cfg.micro_batches})",
                    str(cfg.placement), str(cfg.horizon),
                    str(ba.gradient_delays(cfg, "whole")),
                    str(ba.gradient_delays(cfg, "per_hop")),
                    f"{_workers_bytes(whole) / MIB:.0f}", f"{_workers_bytes(hop) / MIB:.0f}",
                    f"{d / MIB:.0f} ({100 * d / _workers_bytes(whole):.0f} %)",
                    f"{saved[0]:.0f} / {saved[1]:.0f}"])
    return out


def section(bench: dict[str, Any] | None, paper: dict[str, Any] | None,
            table: Callable[[list[str], list[list[Any]]], str]) -> str:
    """The markdown section; ``table`` renders a markdown table in the page's style."""
    head = ("### The delay rules accounted (`lmrepro.rgc.analysis.byte_account`, "
            "`bench/rgc_delay.py`)\n\n")
    body = rows(bench, paper)
    if not body:
        return head + "Not run yet: `python bench/bench_rgc.py`.\n"
    return head + (
        "Running ahead by s = 1 step: each stage's delay (steps from its graph to the latest "
        "part of its gradient) under the executors' whole-backward rule and under a per-hop "
        "rule, and the tensor bytes of the async workers at the peak of a step (the byte "
        "account; parent excluded, the same under both).\n\n"
        + table(["configuration", "placement", "H", "delays, whole", "delays, per hop",
                 "workers MiB, whole", "workers MiB, per hop", "per hop saves MiB",
                 "of which kept graphs / stashed weights MiB"], body) + "\n")
