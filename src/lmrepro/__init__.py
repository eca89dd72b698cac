"""lmrepro: a reproducible replication of SCAPE and RGC for byte-level language models.

The wings, one per paper and the baseline (``scape``, ``rgc``, ``baseline``: each declares what it
adds in its ``wing.WING``, listed in ``wings.WINGS``), over shared parts that name no method of
either paper: ``optim`` (a standalone optimizer library), ``model`` (the byte-level
transformer), ``data`` (fetch, prepare, batches), the one run harness, record and checkpoint
manager (``harness``, ``results``, ``checkpoints``, ``rundirs``), ``stats``
(non-inferiority), and ``pipeline`` (stages, analyses, reports, publication). The ``lmrepro``
command is ``cli``. The map: docs/architecture.md.
"""

__version__ = "0.1.0"
