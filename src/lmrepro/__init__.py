"""lmrepro: a reproducible replication of SCAPE and RGC for byte-level language models.

Domains: ``data`` (fetch, prepare, batches), ``model`` (byte transformer), ``train``
(single-process trainer), ``optim`` (AdamS, SCAPE, TopKEF), ``dist`` (torchrun trainer),
``rgc`` (bounded-horizon local training), ``stats`` (non-inferiority), ``report`` (HTML index),
``config`` (params.yaml schema), ``cli`` (the ``lmrepro`` command).
"""

__version__ = "0.1.0"
