"""How the async executor's processes talk: the messages a stage worker sends the parent (small
dataclasses), the activations and gradients between neighbouring workers (tensors as numpy copies
on bounded queues, each tagged with its step, micro-batch and sending stage: :func:`tagged`,
:func:`untag`) and the bounded waits on them (:class:`Channels`, docs/rgc.md)."""

from __future__ import annotations

import queue as queue_mod
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

POLL_S = 0.5


# -- worker -> parent ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Started:
    """The worker's runtime is up (torch, gloo), before any model or data exists in it."""

    worker: int


@dataclass(frozen=True)
class Ready:
    """The worker built its stages and restored the checkpoint: it starts training."""

    worker: int


@dataclass(frozen=True)
class StepDone:
    """The worker finished ``step``: its stages' mean local losses, and where its time went:
    waiting on the queues (``wait_s``) and in the consensus all-reduce (``consensus_s``, i.e.
    waiting for the slowest worker); the rest was computing."""

    worker: int
    step: int
    losses: dict[int, float]
    wait_s: float
    consensus_s: float


@dataclass(frozen=True)
class StateAfter:
    """The worker's part of the training state after ``done`` steps (``torch.save`` bytes)."""

    worker: int
    done: int
    payload: bytes


@dataclass(frozen=True)
class PartSaved:
    """The worker wrote its part of the training state after ``done`` steps to the run's
    checkpoint directory (:meth:`lmrepro.checkpoints.Checkpoints.save_part`) in ``seconds``:
    nothing but this note crosses."""

    worker: int
    done: int
    seconds: float = 0.0


@dataclass(frozen=True)
class Finished:
    """The worker trained its last step."""

    worker: int


@dataclass(frozen=True)
class Failed:
    """The worker raised while running ``stage``; ``peer`` is the stage it waited on when the
    failure was a timeout (None otherwise)."""

    worker: int
    stage: int
    detail: str
    peer: int | None


@dataclass(frozen=True)
class WorkerEvents:
    """The worker's compute events (:class:`lmrepro.rgc.executors.events.EventLog`'s flat array),
    sent once it trained its last step."""

    worker: int
    rows: Any


Message = (Started | Ready | StepDone | StateAfter | PartSaved | Finished | Failed
           | WorkerEvents)


# -- worker <-> worker ---------------------------------------------------------------------------

class MessageMismatch(RuntimeError):
    """A worker received an activation or gradient tagged with another (step, micro-batch,
    stage) than the one it was about to use it for."""


def tagged(step: int, micro_batch: int, stage: int, payload: Any) -> tuple[int, int, int, Any]:
    """What travels between two workers: the tag (``step`` whose graph the payload belongs to,
    ``micro_batch``, the sending ``stage``) and the payload's tensors (:func:`to_wire`)."""
    return step, micro_batch, stage, to_wire(payload)


def untag(item: tuple[int, int, int, Any], step: int, micro_batch: int, stage: int, what: str
          ) -> Any:
    """The payload of a :func:`tagged` message, after checking its tag against the (``step``,
    ``micro_batch``, ``stage``) the receiver expects; a mismatch raises
    :class:`MessageMismatch` naming both (a slip in the lag or in a resend after a resume would
    otherwise pair a gradient with another step's graph of the same shape, silently)."""
    got = tuple(item[:3])
    if got != (step, micro_batch, stage):
        raise MessageMismatch(
            f"{what}: received a message tagged (step {got[0]}, micro-batch {got[1]}, stage "
            f"{got[2]}), expected (step {step}, micro-batch {micro_batch}, stage {stage})")
    return from_wire(item[3])

# -- parent -> worker: the training data ---------------------------------------------------------

@dataclass(frozen=True)
class MappedBytes:
    """A read-only byte array passed by its file, not its bytes: the worker maps the same file
    (the page cache holds one copy for every process) instead of unpickling a private copy."""

    path: str
    offset: int
    length: int

    def open(self) -> np.ndarray:
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.offset,
                         shape=(self.length,))


def by_reference(data: np.ndarray) -> np.ndarray | MappedBytes:
    """``data`` as a worker should receive it: a contiguous 1-D uint8 view of a file mapping
    (a prepared split, :func:`lmrepro.data.prepare.load_split`) as :class:`MappedBytes`;
    anything else (an array built in memory) by value."""
    mm = data                     # the mapping itself: the array whose base is no array
    while isinstance(mm.base, np.ndarray):
        mm = mm.base
    if not isinstance(mm, np.memmap) or getattr(mm, "filename", None) is None \
            or data.dtype != np.uint8 or data.ndim != 1 or not data.flags.c_contiguous:
        return data
    start = mm.offset + (data.ctypes.data - mm.ctypes.data)
    return MappedBytes(str(mm.filename), int(start), int(data.shape[0]))


def received(data: np.ndarray | MappedBytes | None) -> np.ndarray | None:
    """The worker's side of :func:`by_reference`."""
    return data.open() if isinstance(data, MappedBytes) else data


def to_wire(obj: Any) -> Any:
    """Tensors (in a tuple or a dict) as numpy copies, which a queue pickles by value through
    its pipe: measured here faster than torch's shared-memory hand-over (one shared-memory
    segment and file descriptor per tensor, docs/rgc.md), and the copy is the "activation copy"
    the executor keeps apart from the sender's graph."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().numpy().copy()
    if isinstance(obj, tuple):
        return tuple(to_wire(x) for x in obj)
    if isinstance(obj, dict):
        return {k: to_wire(v) for k, v in obj.items()}
    return obj


def from_wire(obj: Any) -> Any:
    """The inverse of :func:`to_wire`."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, tuple):
        return tuple(from_wire(x) for x in obj)
    if isinstance(obj, dict):
        return {k: from_wire(v) for k, v in obj.items()}
    return obj


class Stopped(Exception):
    """The parent asked this worker to stop (another worker failed)."""


class WaitTimeout(TimeoutError):
    """A worker waited ``rgc.timeout_s`` on stage ``peer`` (to receive from it or to send
    to it)."""

    def __init__(self, message: str, peer: int) -> None:
        super().__init__(message)
        self.peer = peer


class Channels:
    """One worker's waits on its neighbours: every queue get/put polls the parent's stop event,
    gives up after ``timeout_s`` (:class:`WaitTimeout`), and publishes in the shared ``status``
    array what the worker is waiting for, so that the parent can follow a chain of waiting
    workers to the stage that really stopped (:func:`stalled_stage`)."""

    COMPUTING, RECEIVING, SENDING = 0, 1, 2

    def __init__(self, w: int, stop: Any, timeout_s: float, status: Any) -> None:
        self.w, self.stop, self.timeout_s, self.status = w, stop, timeout_s, status
        self.waited_s = 0.0   # time spent in get/put, i.e. waiting on a neighbour or the queue

    def _waiting(self, kind: int, peer: int) -> None:
        self.status[2 * self.w + 1] = peer
        self.status[2 * self.w] = kind

    def get(self, q: Any, what: str, sender: int) -> Any:
        return self._wait(lambda: q.get(timeout=POLL_S), queue_mod.Empty, self.RECEIVING,
                          sender, f"for {what}")

    def put(self, q: Any, item: Any, what: str, receiver: int) -> None:
        self._wait(lambda: q.put(item, timeout=POLL_S), queue_mod.Full, self.SENDING,
                   receiver, f"to send {what}")

    def _wait(self, attempt: Callable[[], Any], busy: type[Exception], kind: int, peer: int,
              what: str) -> Any:
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        self._waiting(kind, peer)
        try:
            while True:
                if self.stop.is_set():
                    raise Stopped()
                try:
                    result = attempt()
                except busy:
                    if time.monotonic() > deadline:
                        # the status keeps saying "waiting on peer": the parent follows the
                        # chain of waits through this worker to the stage that stopped
                        raise WaitTimeout(f"waited {self.timeout_s:.0f} s {what} "
                                          f"(rgc.timeout_s); is stage {peer} alive?",
                                          peer) from None
                    continue
                self._waiting(self.COMPUTING, -1)
                return result
        finally:
            self.waited_s += time.perf_counter() - t0


def stalled_stage(status: Any, placement: list[list[int]], peer: int) -> tuple[int, list[int]]:
    """Follow the waits from stage ``peer``: while its worker is itself waiting on another
    stage, move to that one. Returns the stage at the end (whose worker is computing, hung or
    dead: the one that stopped the pipeline) and the chain of stages walked."""
    worker_of = {k: w for w, ks in enumerate(placement) for k in ks}
    chain = [peer]
    while True:
        w = worker_of[chain[-1]]
        if status[2 * w] == Channels.COMPUTING:
            return chain[-1], chain
        nxt = int(status[2 * w + 1])
        if nxt in chain or nxt not in worker_of:
            return chain[-1], chain
        chain.append(nxt)
