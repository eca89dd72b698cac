"""Shared helpers of the benchmarks in ``bench/`` (not used by training itself).

* :mod:`lmrepro.bench.machine`: what machine and software a measurement ran on, and its load;
* :mod:`lmrepro.bench.timing`: wall-clock timers and robust summaries of repeated timings;
* :mod:`lmrepro.bench.netns`: a Linux network namespace with a token-bucket-shaped loopback
  (``ip netns`` + ``tc qdisc ... tbf``), as a context manager that always cleans up;
* :mod:`lmrepro.bench.alphabeta`: the alpha-beta (latency-bandwidth) communication model, its
  least-squares fit and the ideal step time / speedup it predicts;
* :mod:`lmrepro.bench.flops`: FLOP counts of matmuls and of training, and model FLOP utilisation.

The pure functions here are tested in ``tests/test_bench_math.py``; the benchmarks that use them
are never part of the test suite.
"""

from pathlib import Path

#: where the benchmarks keep their results and the pipeline reads them: relative to the
#: repository root, the working directory of every stage (``dvc.yaml`` names these files as deps)
BENCH_RESULTS = Path("bench/results")
