"""The training-length study engine (lmrepro.pipeline.study_engine) with a fake wing: what it
trains in which order, which lrs it applies where, and what it writes (sweep.json,
edge_check.json, plan.json)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmrepro.pipeline.study_engine import LengthStudy, Point, RunDirs, no_study, sweep_grid
from lmrepro.results import write_summary
from lmrepro.rundirs import seed_dir
from lmrepro.sweep import sweep_lr


@dataclass(frozen=True)
class Run:
    name: str
    lr: float


def bpb(name: str, lr: float) -> float:
    """Made-up validation bits/byte: ``a`` is best at its own lr (the grid's centre), ``b``
    the higher its lr the better (its winner on the grid's edge)."""
    base = name.split("@")[0]
    return 1.0 + abs(math.log(lr / 0.01)) if base == "a" else 1.0 - lr


class FakeWing:
    """Writes a finished summary per run and seed at ``<stage>/<kind>/<size>/L<steps>/<run>/
    seed<N>`` and records every call."""

    def __init__(self, stage: Path, sizes: Sequence[str] = ("s", "m")) -> None:
        self.stage = stage
        self.by_size = {size: [Run("a", 0.01), Run("b", 0.02)] for size in sizes}
        self.calls: list[list[tuple[str, str, int, list[tuple[str, float]], list[int]]]] = []
        self.extras_got: list[list[Run]] = []

    def runs(self, size: str) -> list[Run]:
        return list(self.by_size[size])

    def name(self, run: Run) -> str:
        return run.name

    def lr(self, run: Run) -> float:
        return run.lr

    def at_lr(self, run: Run, lr: float) -> Run:
        return replace(run, lr=lr)

    def variant(self, run: Run, lr: float) -> Run:
        return Run(f"{run.name}@lr{lr:g}", lr)

    def train(self, points: Sequence[Point[Run]]) -> list[RunDirs]:
        self.calls.append([(p.kind, p.size, p.steps, [(r.name, r.lr) for r in p.runs],
                            list(p.seeds)) for p in points])
        out = []
        for p in points:
            dirs: RunDirs = {}
            for run in p.runs:
                for seed in p.seeds:
                    d = self.stage / p.kind / p.size / f"L{p.steps}" / run.name / seed_dir(seed)
                    d.mkdir(parents=True, exist_ok=True)
                    write_summary(d, {
                        "name": run.name, "method": "adamw", "corpus": "c", "seed": seed,
                        "steps": p.steps, "tokens": 1, "final_bpb": bpb(run.name, run.lr),
                        "tokens_per_s": 1.0, "mean_step_time_s": 1.0, "train_time_s": 1.0,
                        "peak_rss_bytes": 0, "n_params": 0, "processes": 1, "threads": 1})
                    dirs[run.name, seed] = d
            out.append(dirs)
        return out

    def extras(self, verdict_runs: list[Run]) -> dict[str, Path]:
        self.extras_got.append(verdict_runs)
        (dirs,) = self.train([Point("extra", "s", 20, verdict_runs[:1], [0])])
        return {f"extra/{k[0]}": d for k, d in dirs.items()}


def section(**over: object) -> SimpleNamespace:
    s = {"lengths": {"s": [10, 20], "m": [5]}, "seeds": {"s": [1], "m": [0, 1]},
         "verdict_size": "s", "verdict_steps": 20, "verdict_seeds": [0, 2],
         "sweep_factors": [0.5, 1.0, 2.0], "sweep_seed": 9, "edge_check": True}
    return SimpleNamespace(**{**s, **over})


def test_the_sweep_grid_starts_at_its_centre_or_goes_run_by_run() -> None:
    a, b = Run("a", 1.0), Run("b", 1.0)
    assert sweep_grid([a, b], [0.25, 0.5, 1.0, 2.0, 4.0], "centre_first") == [
        (a, 1.0), (b, 1.0), (a, 0.5), (b, 0.5), (a, 2.0), (b, 2.0), (a, 0.25), (b, 0.25),
        (a, 4.0), (b, 4.0)]
    assert sweep_grid([a, b], [0.5, 1.0, 2.0], "by_run") == [
        (a, 0.5), (a, 1.0), (a, 2.0), (b, 0.5), (b, 1.0), (b, 2.0)]
    assert sweep_lr(0.003, 1 / 3) == 0.001 and sweep_lr(0.0123, 0.5) == 0.00615


def test_the_study_sweeps_then_trains_the_verdict_point_first(tmp_path: Path) -> None:
    wing = FakeWing(tmp_path)
    out = LengthStudy(section(), wing, tmp_path, plan_notes={"parallel": 3}).run()
    sweep_call, points_call, extra_call, edge_call = wing.calls
    # the sweep: the verdict point, one seed, the grid's centre first
    assert sweep_call == [("sweep", "s", 20, [
        ("a@lr0.01", 0.01), ("b@lr0.02", 0.02), ("a@lr0.005", 0.005), ("b@lr0.01", 0.01),
        ("a@lr0.02", 0.02), ("b@lr0.04", 0.04)], [9])]
    best = {"a": 0.01, "b": 0.04}
    # the verdict point (its size's seeds and the verdict seeds) at the winners, then the
    # others in the order of lengths; the winners apply at the verdict size only
    at_best = [("a", 0.01), ("b", 0.04)]
    assert points_call == [("runs", "s", 20, at_best, [0, 1, 2]), ("runs", "s", 10, at_best, [1]),
                           ("runs", "m", 5, [("a", 0.01), ("b", 0.02)], [0, 1])]
    # the extras after them, given the verdict size's runs at the winners
    assert wing.extras_got == [[Run("a", 0.01), Run("b", 0.04)]]
    assert extra_call == [("extra", "s", 20, [("a", 0.01)], [0])]
    # the edge check last: only the winner on its grid's edge, one grid step beyond it
    assert edge_call == [("sweep-edge", "s", 20, [("b@lr0.08", 0.08)], [9])]

    sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [(r["run"], r["lr"]) for r in sweep["rows"]] == [
        ("a", 0.01), ("b", 0.02), ("a", 0.005), ("b", 0.01), ("a", 0.02), ("b", 0.04)]
    assert sweep["rows"][0]["final_bpb"] == 1.0 and sweep["rows"][0]["diverged_at_step"] is None
    assert {k: sweep[k] for k in ("size", "steps", "seed", "factors", "best", "on_edge")} == {
        "size": "s", "steps": 20, "seed": 9, "factors": [0.5, 1.0, 2.0], "best": best,
        "on_edge": ["b"]}
    edge = json.loads((tmp_path / "sweep" / "edge_check.json").read_text())
    assert edge == {"size": "s", "steps": 20, "seed": 9, "rows": [{
        "run": "b", "grid_lr": 0.04, "grid_bpb": pytest.approx(0.96), "beyond_lr": 0.08,
        "beyond_final_bpb": pytest.approx(0.92), "beyond_diverged_at_step": None,
        "beyond_is_better": True}]}

    # every run by its path below runs/ (the verdict point first), then the extras
    labels = [f"s/L20/{r}/seed{n}" for r in "ab" for n in (0, 1, 2)] + \
        [f"s/L10/{r}/seed1" for r in "ab"] + [f"m/L5/{r}/seed{n}" for r in "ab" for n in (0, 1)]
    assert list(out) == labels + ["extra/a"]
    assert out["s/L20/b/seed2"] == tmp_path / "runs" / "s" / "L20" / "b" / "seed2"
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan == {"runs": {k: str(v) for k, v in out.items()}, "lrs": best, "parallel": 3}


def test_the_sweep_brackets_only_the_runs_named_and_can_go_run_by_run(tmp_path: Path) -> None:
    wing = FakeWing(tmp_path)
    LengthStudy(section(edge_check=False), wing, tmp_path, sweep_runs=["b"],
                sweep_order="by_run").run()
    assert wing.calls[0] == [("sweep", "s", 20, [
        ("b@lr0.01", 0.01), ("b@lr0.02", 0.02), ("b@lr0.04", 0.04)], [9])]
    # a run the sweep left out keeps its own lr at the verdict size; no edge check trained
    assert wing.calls[1][0][3] == [("a", 0.01), ("b", 0.04)]
    assert len(wing.calls) == 3 and not (tmp_path / "sweep" / "edge_check.json").exists()
    assert json.loads((tmp_path / "plan.json").read_text())["lrs"] == {"b": 0.04}


def test_without_sweep_factors_nothing_is_swept_and_every_run_keeps_its_lr(tmp_path: Path
                                                                           ) -> None:
    wing = FakeWing(tmp_path)
    out = LengthStudy(section(sweep_factors=[]), wing, tmp_path).run()
    points, _extra = wing.calls     # no sweep, and no edge check without a sweep table
    assert [p[0] for p in points] == ["runs"] * 3
    assert points[0][3] == [("a", 0.01), ("b", 0.02)]
    assert not (tmp_path / "sweep").exists()
    assert json.loads((tmp_path / "plan.json").read_text()) == {
        "runs": {k: str(v) for k, v in out.items()}, "lrs": {}}


class DivergingWing(FakeWing):
    """``b`` diverges at its best lr of the sweep."""

    def train(self, points: Sequence[Point[Run]]) -> list[RunDirs]:
        out = super().train(points)
        d = out[0].get(("b@lr0.04", 9))
        if d is not None:
            summary = json.loads((d / "summary.json").read_text())
            write_summary(d, {**summary, "final_bpb": None, "diverged_at_step": 3})
        return out


def test_a_diverged_sweep_run_never_wins(tmp_path: Path) -> None:
    study = LengthStudy(section(), DivergingWing(tmp_path), tmp_path)
    assert study.sweep() == {"a": 0.01, "b": 0.02}
    rows = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["rows"]
    assert [r["diverged_at_step"] for r in rows if r["lr"] == 0.04] == [3]


def test_a_profile_without_a_study_writes_a_plan_saying_so(tmp_path: Path) -> None:
    assert no_study(tmp_path / "st") == {}
    assert json.loads((tmp_path / "st" / "plan.json").read_text()) == {
        "runs": {}, "lrs": {}, "note": "no training-length study in this profile"}


def test_a_seed_folder_name_is_read_back_by_the_rule_that_writes_it() -> None:
    """The seed's folder name is declared once (rundirs.seed_dir): reading it back gives the
    seed; a folder of another name is refused by name, never parsed by guess."""
    from lmrepro.errors import ParameterError
    from lmrepro.rundirs import seed_dir, seed_of

    assert [seed_of(seed_dir(s)) for s in (0, 3, 1000)] == [0, 3, 1000]
    for bad in ("seedx", "run3", "seed", "seed-1"):
        with pytest.raises(ParameterError, match="seed<N>"):
            seed_of(bad)


def test_a_run_label_has_one_layout_and_the_run_first_order_reads_the_same() -> None:
    """Every stage and study puts a run at ``<point>/seed<N>/<run>`` (rundirs.run_path); the
    run-first order the RGC studies were published in (``<point>/<run>/seed<N>``) is read to
    the same (point, seed, run), and a label with no seed folder is refused by name."""
    from lmrepro.errors import ParameterError
    from lmrepro.rundirs import run_label, run_path, split_run_label

    assert run_label("4x64/L3000", 2, "rgc_H2") == "4x64/L3000/seed2/rgc_H2"
    assert run_path("runs/c", 0, "adams") == Path("runs/c/seed0/adams")
    for label in ("4x64/L3000/seed2/rgc_H2", "4x64/L3000/rgc_H2/seed2"):
        assert split_run_label(label) == ("4x64/L3000", 2, "rgc_H2")
    assert split_run_label("shakespeare/seed0/backprop") == ("shakespeare", 0, "backprop")
    for bad in ("4x64/L3000/rgc/run1", "rgc"):
        with pytest.raises(ParameterError, match="run label"):
            split_run_label(bad)


def test_seed_first_moves_run_first_folders_with_their_identity_and_leaves_a_taken_place(
        tmp_path: Path) -> None:
    """A run-first point becomes seed-first: every seed's folder moves as it is (its files
    untouched), each takes a copy of its run's identity, a folder set aside moves by the same
    rule, and a place already taken keeps both folders (nothing is lost)."""
    from lmrepro.rundirs import seed_first

    point = tmp_path / "L3"
    for run in ("rgc", "backprop", "rgc.kept-0123"):
        (point / run).mkdir(parents=True)
        (point / run / "identity.json").write_text(json.dumps({"run": run}))
        for seed in (0, 1):
            (point / run / f"seed{seed}").mkdir()
            (point / run / f"seed{seed}" / "summary.json").write_text(f"{run} {seed}")
    (point / "seed1" / "backprop").mkdir(parents=True)        # taken: both stay
    assert seed_first(point) == 5
    for run in ("rgc", "rgc.kept-0123"):
        for seed in (0, 1):
            moved = point / f"seed{seed}" / run
            assert (moved / "summary.json").read_text() == f"{run} {seed}"
            assert json.loads((moved / "identity.json").read_text()) == {"run": run}
        assert not (point / run).exists()
    assert (point / "seed0" / "backprop" / "summary.json").read_text() == "backprop 0"
    assert (point / "backprop" / "seed1" / "summary.json").read_text() == "backprop 1"
    assert not list((point / "seed1" / "backprop").iterdir())
    assert seed_first(point) == 0 and seed_first(tmp_path / "none") == 0
