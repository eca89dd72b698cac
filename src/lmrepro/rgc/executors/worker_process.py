"""The body of an async stage worker's process (:func:`_stage_worker`): its start, the
rendezvous with the other workers, the worker the run asks for (``WorkerArgs.kind``: an RGC
:class:`~lmrepro.rgc.executors.worker.StageWorker` or the pipelined global backprop's
:class:`~lmrepro.rgc.executors.pipelined.PipelinedWorker`) and every failure sent to the parent."""

from __future__ import annotations

import datetime
import traceback

import torch
import torch.distributed as dist

from lmrepro.lifetime import die_with_multiprocessing_parent, set_fault_spec
from lmrepro.rgc.config import RGCConfig
from lmrepro.rgc.executors.pipelined import PipelinedWorker
from lmrepro.rgc.executors.wire import Failed, Finished, Ready, Started, Stopped
from lmrepro.rgc.executors.worker import StageWorker, WorkerArgs


def _stage_worker(a: WorkerArgs) -> None:
    """Body of worker ``a.w``'s process: the protocol with the parent
    (:mod:`lmrepro.rgc.executors.wire`). Every failure goes to the parent as :class:`Failed`, with
    its traceback."""
    die_with_multiprocessing_parent()      # ends with the run's process (docs/reliability.md)
    set_fault_spec(a.faults)
    worker: StageWorker | None = None
    stages: list[int] = []
    try:
        cfg = RGCConfig(**a.cfg_dict)
        stages = cfg.placement[a.w]
        torch.set_num_threads(cfg.worker_threads[a.w])
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.w,
            world_size=cfg.n_workers, timeout=datetime.timedelta(seconds=cfg.timeout_s))
        # the parent measures the tree now, with every worker's runtime up and no data yet
        a.results.put(Started(a.w))
        if not a.go.wait(timeout=cfg.timeout_s):
            raise TimeoutError(f"the parent did not start the run within "
                               f"{cfg.timeout_s:.0f} s (rgc.timeout_s)")
        worker = (StageWorker if a.kind == "rgc" else PipelinedWorker)(a, cfg)
        a.results.put(Ready(a.w))
        worker.train()
        a.results.put(Finished(a.w))
        a.finish.wait(timeout=cfg.timeout_s)
    except Stopped:
        pass
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        stage = (worker.runner.current_stage if worker is not None
                 else (stages[0] if stages else a.w))
        a.results.put(Failed(a.w, stage, traceback.format_exc(), getattr(exc, "peer", None)))
        a.finish.wait(timeout=30)
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
