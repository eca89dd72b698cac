"""What each async worker did when: timestamped compute events (docs/rgc.md, "Events").

Every worker records, per stage, step and micro-batch, when it ran the stage's blocks forward,
its readout, and its backward, on the system-wide monotonic clock (``time.monotonic_ns``, the
same clock in every process of the machine). An event is seven integers in a flat
``array("q")`` (a few hundred nanoseconds per event, 56 bytes); the worker sends its array to
the parent when it has trained its last step, and the parent writes every worker's events to
the run directory (``events.json``) and returns them (:attr:`TrainResult.events`).

``step`` is the step whose batch the event's graph belongs to; ``at`` the step the worker was
on when it ran it: they differ for the backward of a worker that runs ahead (docs/rgc.md,
"Running ahead"), which backpropagates at step t the graphs of step ``t - lag``.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lmrepro.errors import check
from lmrepro.io import atomic_write_json, read_json

EVENTS = "events.json"
PHASES = ("forward", "readout", "backward")
FORWARD, READOUT, BACKWARD = range(3)
FIELDS = 7      # stage, phase, step, micro-batch, at, start_ns, end_ns
COLUMNS = ("worker", "stage", "phase", "step", "micro_batch", "at", "start_ns", "end_ns")


@dataclass(frozen=True)
class Event:
    """One compute span of worker ``worker`` on stage ``stage`` (monotonic nanoseconds)."""

    worker: int
    stage: int
    phase: str
    step: int
    micro_batch: int
    at: int
    start_ns: int
    end_ns: int


class EventLog:
    """One worker's events: :meth:`start` returns the clock, :meth:`add` records the span from
    it to now. ``at`` is the step the worker is on (set by the worker)."""

    def __init__(self) -> None:
        self.rows = array("q")
        self.at = 0

    @staticmethod
    def start() -> int:
        return time.monotonic_ns()

    def add(self, phase: int, stage: int, step: int, micro_batch: int, start_ns: int) -> None:
        self.rows.extend((stage, phase, step, micro_batch, self.at, start_ns,
                          time.monotonic_ns()))


def decode(worker: int, rows: Iterable[int]) -> list[Event]:
    """The events of one worker's flat array (:class:`EventLog`)."""
    flat = list(rows)
    check(len(flat) % FIELDS == 0, "events", len(flat), f"must be a multiple of {FIELDS} "
          "integers (one event each)")
    return [Event(worker, flat[i], PHASES[flat[i + 1]], *flat[i + 2:i + FIELDS])
            for i in range(0, len(flat), FIELDS)]


def collect(by_worker: Mapping[int, Iterable[int]]) -> list[Event]:
    """Every worker's events, ordered by start time."""
    out = [e for w in sorted(by_worker) for e in decode(w, by_worker[w])]
    return sorted(out, key=lambda e: (e.start_ns, e.worker, e.stage))


def write(run_dir: str | Path, events: list[Event], start: int) -> list[Event]:
    """Write ``events`` (this invocation's, from step ``start``) to ``run_dir/events.json``
    after the events an earlier invocation of the run recorded before ``start`` (a resumed run:
    what it recorded from ``start`` on was trained again). Returns what the file holds."""
    path = Path(run_dir) / EVENTS
    kept = [e for e in read(run_dir) if e.at < start] if path.exists() else []
    every = kept + events
    atomic_write_json(path, {"columns": list(COLUMNS), "phases": list(PHASES),
                             "clock": "time.monotonic_ns (system-wide)",
                             "rows": [[getattr(e, c) for c in COLUMNS] for e in every]})
    return every


def read(run_dir: str | Path) -> list[Event]:
    """The events of a run directory (:func:`write`)."""
    data = read_json(Path(run_dir) / EVENTS)
    check(tuple(data["columns"]) == COLUMNS, EVENTS, data["columns"],
          f"must have the columns {list(COLUMNS)}")
    return [Event(*row) for row in data["rows"]]


def span(events: Iterable[Event], worker: int, phase: str, step: int) -> tuple[int, int] | None:
    """``(first start, last end)`` of ``worker``'s events of ``phase`` on step ``step``'s
    graphs (every stage and micro-batch); None when there is none."""
    sel = [e for e in events if e.worker == worker and e.phase == phase and e.step == step]
    if not sel:
        return None
    return min(e.start_ns for e in sel), max(e.end_ns for e in sel)


def overtakes(events: list[Event], n_workers: int, steps: int) -> list[tuple[int, int]]:
    """The ``(worker w, step t)`` where worker w started step t+1's forward before worker w+1
    had finished the backward of step t's graphs: the workers running ahead of each other. A
    lockstep run has none (its consensus is a barrier between steps)."""
    out = []
    for w in range(n_workers - 1):
        for t in range(steps - 1):
            nxt, below = span(events, w, "forward", t + 1), span(events, w + 1, "backward", t)
            if nxt is not None and below is not None and nxt[0] < below[1]:
                out.append((w, t))
    return out
