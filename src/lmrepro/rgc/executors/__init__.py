"""The RGC executors and what runs them: :func:`~lmrepro.rgc.executors.runner.train` picks one
(:mod:`~lmrepro.rgc.executors.sync`, :mod:`~lmrepro.rgc.executors.async_`,
:mod:`~lmrepro.rgc.executors.pipelined`, :mod:`~lmrepro.rgc.executors.backprop`), and
:mod:`~lmrepro.rgc.executors.isolated` runs it in a fresh process tree; the async stage workers
(:mod:`~lmrepro.rgc.executors.worker`, ``worker_process``, ``worker_stages``), the messages
between them (:mod:`~lmrepro.rgc.executors.wire`), their events and fault points, and the sync
executor's delay lines (``gradient_delay``, ``consensus_queue``)."""
