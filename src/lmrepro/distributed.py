"""Process-group set-up from the torchrun environment, with bounded timeouts and failures that
name the rank.

``torchrun`` exports ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
:func:`init_from_env` reads them and initialises gloo on CPU or NCCL on GPU, with a finite
timeout so that a dead or stalled peer makes the other ranks fail instead of hanging. Without those
variables (plain ``python -m lmrepro train-scape``) it returns a world of one and no process group:
the optimizers then use local collectives.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lmrepro.errors import check


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for a local rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

DEFAULT_TIMEOUT_S = 60.0


class DistributedFailure(RuntimeError):
    """A collective failed: a peer died, stalled beyond the timeout, or the network broke."""


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    timeout_s: float

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def initialized(self) -> bool:
        return self.backend is not None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    check(value.strip().lstrip("-").isdigit(), f"environment {name}", value, "must be an integer")
    return int(value)


def resolve_device(device: str, local_rank: int) -> torch.device:
    """``"auto"``: ``cuda:LOCAL_RANK`` when CUDA is available, else CPU; or an explicit device."""
    check(device in ("auto", "cpu", "cuda"), "device", device, "must be 'auto', 'cpu' or 'cuda'")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    check(torch.cuda.is_available(), "device", device, "CUDA is not available on this machine")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S, device: str = "auto",
                  backend: str | None = None) -> DistContext:
    """Initialise ``torch.distributed`` from the torchrun environment (see module docstring).

    Args:
        timeout_s: bound on every collective and on the rendezvous store (seconds, > 0).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        backend: ``"gloo"``/``"nccl"``; default nccl for CUDA devices, gloo otherwise.
    """
    check(isinstance(timeout_s, (int, float)) and timeout_s > 0, "timeout_s", timeout_s,
          "must be a number of seconds > 0")
    rank, world, local = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    if world is None or rank is None:
        dev = resolve_device(device, 0)
        return DistContext(0, 1, 0, dev, None, float(timeout_s))
    local = rank if local is None else local
    check(world >= 1, "environment WORLD_SIZE", world, "must be >= 1")
    check(0 <= rank < world, "environment RANK", rank, f"must be in [0, WORLD_SIZE={world})")
    dev = resolve_device(device, local)
    if backend is None:
        backend = "nccl" if dev.type == "cuda" else "gloo"
    check(backend in ("gloo", "nccl"), "backend", backend, "must be 'gloo' or 'nccl'")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        # Make NCCL raise on the timeout instead of hanging inside a kernel.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=float(timeout_s)))
    return DistContext(rank, world, local, dev, backend, float(timeout_s))


def shutdown(ctx: DistContext) -> None:
    """Destroy the process group (if any); never raises."""
    if ctx.initialized and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


@contextlib.contextmanager
def collective_guard(ctx: DistContext, what: str) -> Iterator[None]:
    """Turn a failing collective into :class:`DistributedFailure` naming this rank, the world and
    the operation, with the likely cause (a peer died or stalled past the timeout)."""
    try:
        yield
    except (RuntimeError, ConnectionError, OSError) as exc:
        if isinstance(exc, DistributedFailure) or not ctx.initialized:
            raise
        raise DistributedFailure(
            f"rank {ctx.rank} of {ctx.world_size}: {what} failed: a peer process probably died or "
            f"stalled (process-group timeout {ctx.timeout_s:g} s, backend {ctx.backend}). "
            f"Original error: {type(exc).__name__}: {str(exc).strip()[:500]}") from exc


def report_failure(ctx: DistContext, exc: BaseException) -> None:
    """One clear line on stderr (torchrun shows it with the rank prefix)."""
    print(f"[lmrepro rank {ctx.rank}/{ctx.world_size}] {exc}", file=sys.stderr,
          flush=True)
