"""The one engine of the training-length studies: model sizes x training lengths x runs x seeds,
tuned by an lr sweep at the verdict point, each wing supplying only what is its own.

The engine's order is the order in which results matter, so an interrupted study has the
verdict first:

1. the lr sweep at the verdict point (``verdict_size`` at its longest length): every swept run
   at ``sweep_factors`` times its own lr (to 3 significant digits, :func:`lmrepro.sweep.sweep_lr`),
   one seed the study does not use, scored on the validation split; the winners by run
   (:func:`lmrepro.sweep.select_best`) in ``sweep/sweep.json``;
2. the verdict point, at the winners and the verdict seeds; then every other point of
   ``lengths`` with its size's seeds (the winners apply at the verdict size only: other sizes
   keep their runs' own lrs);
3. the wing's extra points (:meth:`StudyWing.extras`, e.g. ablations at the verdict point);
4. the edge check: each winner on its grid's edge trained once more one grid step beyond it,
   reported in ``sweep/edge_check.json``, never applied;
5. ``plan.json``: every run directory by its label, and the winners.

A wing (:class:`StudyWing`) names its runs, reads and sets their lr, makes a run's sweep variant
(``<run>@lr<lr>``, the lr written its own way) and trains the runs of a list of points, keeping
its own directory layout below ``<stage>/<kind>/`` and its own identities.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from lmrepro.io import atomic_write_json, read_json
from lmrepro.pipeline.study_section import EDGE_JSON, SWEEP, SWEEP_JSON, StudySection
from lmrepro.results import read_summary
from lmrepro.sweep import beyond_edge, edge_row, on_edge, select_best, sweep_lr

PLAN = "plan.json"

R = TypeVar("R")


@dataclass(frozen=True)
class Point(Generic[R]):
    """The runs of one point to train: their folder kind (``runs``, ``sweep``, ``sweep-edge``),
    the model size, the length in optimizer steps, the runs and their seeds."""

    kind: str
    size: str
    steps: int
    runs: list[R]
    seeds: list[int]


#: a trained point's run directories by (run name, seed), in the order of the plan
RunDirs = dict[tuple[str, int], Path]


class StudyWing(Protocol[R]):
    """What a wing supplies to the engine: its runs and how to train them."""

    def runs(self, size: str) -> list[R]:
        """The runs of ``size``, each at its own lr."""
        ...

    def name(self, run: R) -> str:
        """The run's name (its directory's)."""
        ...

    def lr(self, run: R) -> float:
        """The run's peak lr."""
        ...

    def at_lr(self, run: R, lr: float) -> R:
        """``run`` at ``lr``, under its own name (a sweep winner applied)."""
        ...

    def variant(self, run: R, lr: float) -> R:
        """``run`` at ``lr`` named ``<name>@lr<lr>`` (a sweep or edge-check run)."""
        ...

    def train(self, points: Sequence[Point[R]]) -> list[RunDirs]:
        """Train (or put back) the runs of ``points``, in their order; the finished run
        directories of each point, all below ``<stage>/<kind>/``."""
        ...

    def extras(self, verdict_runs: list[R]) -> dict[str, Path]:
        """Train the wing's extra points after the study's own (``verdict_runs``: the verdict
        size's runs at the winners); their run directories by label."""
        ...


def sweep_grid(runs: Sequence[R], factors: Sequence[float],
               order: Literal["centre_first", "by_run"]) -> list[tuple[R, float]]:
    """The sweep's (run, factor) pairs in training order: ``centre_first``, the factors from
    the grid's centre outwards (factor 1 first), each at every run, so an interrupted sweep has
    its best guesses; ``by_run``, run after run, each at every factor in order."""
    if order == "by_run":
        return [(r, f) for r in runs for f in factors]
    return [(r, f) for f in sorted(factors, key=lambda f: (abs(math.log(f)), f)) for r in runs]


def _finished(d: Path) -> dict[str, Any]:
    s = read_summary(d)
    return {"final_bpb": s.final_bpb, "diverged_at_step": s.diverged_at_step}


class LengthStudy(Generic[R]):
    """One study under ``stage`` (see the module docstring). ``sweep_runs``: the names of the
    verdict size's runs the sweep brackets (empty: every run); ``sweep_order``: the sweep's
    order (:func:`sweep_grid`), also its rows' in ``sweep.json``; ``plan_notes``: what the wing
    adds to ``plan.json``."""

    def __init__(self, section: StudySection, wing: StudyWing[R], stage: str | Path, *,
                 sweep_runs: Collection[str] = (),
                 sweep_order: Literal["centre_first", "by_run"] = "centre_first",
                 plan_notes: Mapping[str, Any] | None = None) -> None:
        self.section, self.wing, self.stage = section, wing, Path(stage)
        self.sweep_runs, self.sweep_order = sweep_runs, sweep_order
        self.plan_notes = dict(plan_notes or {})

    def _train_one(self, point: Point[R]) -> RunDirs:
        return self.wing.train([point])[0]

    def sweep(self) -> dict[str, float]:
        """The verdict point's lr sweep (one seed, validation split); the winners by run."""
        s, w = self.section, self.wing
        if not s.sweep_factors:
            return {}
        runs = [r for r in w.runs(s.verdict_size)
                if not self.sweep_runs or w.name(r) in self.sweep_runs]
        grid = [(w.name(r), w.variant(r, sweep_lr(w.lr(r), f)))
                for r, f in sweep_grid(runs, s.sweep_factors, self.sweep_order)]
        dirs = self._train_one(Point(SWEEP, s.verdict_size, s.verdict_steps,
                                     [at for _, at in grid], [s.sweep_seed]))
        rows = [{"run": name, "lr": w.lr(at), **_finished(dirs[w.name(at), s.sweep_seed])}
                for name, at in grid]
        best = select_best(rows)
        atomic_write_json(self.stage / SWEEP / SWEEP_JSON, {
            "size": s.verdict_size, "steps": s.verdict_steps, "seed": s.sweep_seed,
            "factors": list(s.sweep_factors), "rows": rows, "best": best,
            "on_edge": on_edge(rows, best)})
        return best

    def runs_of(self, size: str, best: Mapping[str, float]) -> list[R]:
        """The runs of ``size``: at the sweep's winners at the verdict size, else their own."""
        w = self.wing
        runs = w.runs(size)
        if size != self.section.verdict_size:
            return runs
        return [w.at_lr(r, best[w.name(r)]) if w.name(r) in best else r for r in runs]

    def points(self, best: Mapping[str, float]) -> list[Point[R]]:
        """The study's points: the verdict point (its size's seeds and the verdict seeds)
        first, then the others in the order of ``lengths``."""
        s = self.section
        vsize, vsteps = s.verdict_size, s.verdict_steps
        out = [Point("runs", vsize, vsteps, self.runs_of(vsize, best),
                     sorted(set(s.seeds[vsize]) | set(s.verdict_seeds)))]
        out += [Point("runs", size, steps, self.runs_of(size, best), list(s.seeds[size]))
                for size, lengths in s.lengths.items() for steps in lengths
                if (size, steps) != (vsize, vsteps)]
        return out

    def run(self) -> dict[str, Path]:
        """The sweep, the points, the extras, the edge check, then the plan; every run
        directory by its label (its path below ``<stage>/runs``, or the extras' label)."""
        best = self.sweep()
        points = self.points(best)
        out: dict[str, Path] = {}
        for point, dirs in zip(points, self.wing.train(points)):
            out.update({str(d.relative_to(self.stage / point.kind)): d for d in dirs.values()})
        out.update(self.wing.extras(self.runs_of(self.section.verdict_size, best)))
        if self.section.edge_check:
            self.edge_check()
        atomic_write_json(self.stage / PLAN, {"runs": {k: str(v) for k, v in out.items()},
                                              "lrs": best, **self.plan_notes})
        return out

    def edge_check(self) -> dict[str, Any] | None:
        """Each sweep winner on its grid's edge trained once more one grid step beyond it (the
        sweep's seed and length), to say whether the tuned lr is the optimum or the grid cut it
        off. Reported (``sweep/edge_check.json``), not applied; None without a sweep."""
        path = self.stage / SWEEP / SWEEP_JSON
        if not path.exists():
            return None
        table = read_json(path)
        s, w = self.section, self.wing
        by_name = {w.name(r): r for r in w.runs(s.verdict_size)}
        beyond = [(name, w.variant(by_name[name], beyond_edge(table["rows"], table["best"],
                                                               name)))
                  for name in table["on_edge"]]
        rows = []
        if beyond:
            dirs = self._train_one(Point(f"{SWEEP}-edge", s.verdict_size, table["steps"],
                                         [at for _, at in beyond], [s.sweep_seed]))
            for name, at in beyond:
                got = _finished(dirs[w.name(at), s.sweep_seed])
                rows.append(edge_row(table["rows"], table["best"], name, w.lr(at),
                                     got["final_bpb"], got["diverged_at_step"]))
        out = {"size": table["size"], "steps": table["steps"], "seed": table["seed"],
               "rows": rows}
        atomic_write_json(self.stage / SWEEP / EDGE_JSON, out)
        return out


def no_study(stage_dir: str | Path) -> dict[str, Path]:
    """A profile without a study: a plan saying so (the stage's outputs always exist)."""
    stage_dir = Path(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(stage_dir / PLAN, {"runs": {}, "lrs": {},
                                         "note": "no training-length study in this profile"})
    return {}
