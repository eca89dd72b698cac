"""The step-time model applied to the SCAPE paper's configurations (arXiv 2607.01678).

The model shapes, global batches and sequence lengths are the authors' launch scripts' (public
repository ``mz687/SCAPE_SC26``, ``slurm_scripts/vista/``); the machine is TACC Vista's GH200
nodes: one Grace CPU and one Hopper GPU per node, nodes joined by NDR InfiniBand (Cornell
Virtual Workshop, "Vista: system components"); the per-node network rate is not stated there,
so it is a range (NDR200 to NDR400). Peak dense BF16 of the H100-class GPU: 989 TFLOP/s (NVIDIA
GH200 datasheet; the 1 979 TFLOP/s often quoted is with structured sparsity); HBM3 at 4 TB/s.
The model FLOP utilisation is an assumption (a range). docs/steptime.md gives the sources.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from lmrepro.scape.steptime.model import (Cluster, Link, Options, Workload, bandwidth_for_speedup,
                                          predict, run_wallclock, weak_scaling)

#: the paper's figures, as the paper states them (abstract)
PAPER_STEP_SPEEDUP = 3.26          # per step over dense AdamS, Llama-1.8B, 32 GH200
PAPER_WALL_SAVING = 0.433          # end-to-end wall clock, Llama-500M, 32 GH200
PAPER_WORLD = 32
#: the range of assumptions the paper's machine allows
INTER_GBIT_RANGE = (200.0, 400.0)  # NDR200 .. NDR400 per node
MFU_RANGE = (0.35, 0.6)
DEFAULT_MFU = 0.5


@dataclass(frozen=True)
class PaperModel:
    """A model of the paper, from its launch script's flags."""

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_groups: int
    vocab: int
    seq: int
    global_batch: int
    llama: bool = True
    total_steps: int = 100_000
    dense_steps: int = 0          # SCAPE starts at this step (dense before)
    ramp_steps: int = 0           # sparsity warm-up steps after it (0 up to ``sparsity``)
    sparsity: float = 0.99

    def params(self) -> tuple[float, float]:
        """(all parameters, those in 1-D tensors)."""
        d, L = self.hidden, self.layers
        if self.llama:   # GQA attention, SwiGLU MLP, RMSNorm, untied embeddings, no biases
            kv = self.kv_groups * (d // self.heads)
            per_layer = 2 * d * d + 2 * d * kv + 3 * d * self.ffn
            vec = 2 * d * L + d
            return float(L * per_layer + 2 * self.vocab * d + vec), float(vec)
        vec = L * (4 * d + 2 * d + 3 * d + self.ffn) + 2 * d   # biases and layer norms
        per_layer = 4 * d * d + 2 * d * self.ffn
        return float(L * per_layer + vec + self.vocab * d + self.seq * d), float(vec)

    def workload(self, compute_s: float | None = None) -> Workload:
        n, vec = self.params()
        # 6 N per token plus attention's 12 L d s (fwd + bwd, Megatron-LM's count)
        fpt = 6 * n + 12 * self.layers * self.hidden * self.seq
        return Workload(params=n, tokens_per_step=self.global_batch * self.seq,
                        flops_per_token=fpt, vector_params=vec, compute_s=compute_s)


GPT_345M = PaperModel("GPT-345M", 24, 1024, 4096, 16, 16, 50257, 1024, 512, llama=False,
                      dense_steps=0, ramp_steps=10_000, sparsity=0.99)
LLAMA_500M = PaperModel("Llama-500M", 16, 1536, 4096, 16, 8, 32000, 4096, 1024,
                        dense_steps=2_000, ramp_steps=8_000, sparsity=0.99)
LLAMA_1_8B = PaperModel("Llama-1.8B", 24, 2560, 6912, 32, 8, 128256, 2048, 1024,
                        dense_steps=0, ramp_steps=0, sparsity=0.99)
MODELS = (GPT_345M, LLAMA_500M, LLAMA_1_8B)


def paper_cluster(inter_gbit: float = INTER_GBIT_RANGE[0], mfu: float = DEFAULT_MFU,
                  world: int = PAPER_WORLD, gpus_per_node: int = 1) -> Cluster:
    """Vista's GH200 nodes (one GPU per node) at ``inter_gbit`` per node."""
    return Cluster(world=world, gpus_per_node=gpus_per_node,
                   inter=Link(5e-6, inter_gbit * 1e9 / 8), mfu=mfu)


def paper_table(options: Options | None = None) -> list[dict[str, Any]]:
    """Per model, sparsity and assumption corner: predicted per-step speedup and whole-run
    wall-clock saving (with the paper's dense start and sparsity warm-up)."""
    rows = []
    for m in MODELS:
        for sparsity in (0.9, 0.99):
            o = replace(options or Options(), sparsity=sparsity)
            for gbit in INTER_GBIT_RANGE:
                for mfu in (MFU_RANGE[0], DEFAULT_MFU, MFU_RANGE[1]):
                    c = paper_cluster(gbit, mfu)
                    r = predict(m.workload(), c, o)
                    wall = run_wallclock(m.workload(), c, o, m.total_steps, m.dense_steps,
                                         m.ramp_steps)
                    rows.append({"model": m.name, "params": m.params()[0], "sparsity": sparsity,
                                 "inter_node_gbit": gbit, "mfu": mfu,
                                 "tokens_per_step": m.global_batch * m.seq,
                                 "dense_step_s": r["dense_step_s"],
                                 "scape_step_s": r["scape_step_s"], "speedup": r["speedup"],
                                 "wall_saving": wall["saving"]})
    return rows


def required_bandwidth(model: PaperModel, target_speedup: float, mfu: float = DEFAULT_MFU,
                       options: Options | None = None) -> float | None:
    """The per-node network rate (Gbit/s) at which the model gives ``target_speedup``."""
    o = replace(options or Options(), sparsity=model.sparsity)
    return bandwidth_for_speedup(target_speedup, model.workload(), paper_cluster(mfu=mfu), o)


def wall_saving_at(model: PaperModel, gbit: float, mfu: float = DEFAULT_MFU,
                   options: Options | None = None) -> float:
    o = replace(options or Options(), sparsity=model.sparsity)
    return run_wallclock(model.workload(), paper_cluster(gbit, mfu), o, model.total_steps,
                         model.dense_steps, model.ramp_steps)["saving"]


def required_bandwidth_for_saving(model: PaperModel, saving: float, mfu: float = DEFAULT_MFU
                                  ) -> float | None:
    """The per-node network rate (Gbit/s) at which the whole-run saving equals ``saving``."""
    lo, hi = 0.01, 1e5
    if not wall_saving_at(model, lo, mfu) >= saving >= wall_saving_at(model, hi, mfu):
        return None
    import math
    a, b = math.log(lo), math.log(hi)
    for _ in range(80):
        mid = (a + b) / 2
        a, b = (mid, b) if wall_saving_at(model, math.exp(mid), mfu) > saving else (a, mid)
    return math.exp((a + b) / 2)


def speedup_grid(gbits: list[float], params: list[float], sparsity: float = 0.99,
                 mfu: float = DEFAULT_MFU) -> list[dict[str, float]]:
    """Predicted speedup against network rate and model size (Llama-1.8B's shape of step:
    tokens per step and FLOPs per token 6 N), for the plot of where SCAPE stops paying."""
    o = Options(sparsity=sparsity)
    out = []
    for n in params:
        w = Workload(params=n, tokens_per_step=LLAMA_1_8B.global_batch * LLAMA_1_8B.seq)
        for g in gbits:
            r = predict(w, paper_cluster(g, mfu), o)
            out.append({"params": n, "inter_node_gbit": g, "speedup": r["speedup"]})
    return out


def scaling_table(model: PaperModel = LLAMA_500M, gbit: float = INTER_GBIT_RANGE[0],
                  mfu: float = DEFAULT_MFU) -> list[dict[str, float]]:
    """Weak scaling from 8 to 32 and 128 GPUs at the paper's per-GPU batch."""
    o = Options(sparsity=model.sparsity)
    return weak_scaling(model.workload(), paper_cluster(gbit, mfu), o, (8, 32, 128))


# ---------------------------------------------------------------------------------------------
# The claims table's weak-scaling row (lmrepro.scape.claims): the per-step and wall-clock rows
# take their verdicts from the authors' logs (lmrepro.scape.authors.report)
# ---------------------------------------------------------------------------------------------
def predicted_scaling() -> tuple[str, float, bool | None]:
    """(text, SCAPE's efficiency at 128 GPUs, verdict None): the model has no congestion term,
    so its weak scaling is a property of the model (dense scales as well), not a test."""
    rows = scaling_table()
    eff = {r["world"]: r for r in rows}
    text = ("a model property, not evidence: predicted weak-scaling efficiency from 8 GPUs "
            f"(Llama-500M, {INTER_GBIT_RANGE[0]:g} Gbit/s) " + ", ".join(
                f"{p} GPUs dense {eff[p]['dense_efficiency']:.1%} / SCAPE "
                f"{eff[p]['scape_efficiency']:.1%}" for p in (32, 128))
            + " in a model with no congestion term")
    return text, eff[128]["scape_efficiency"], None
