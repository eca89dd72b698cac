"""Fetch one corpus, whatever its kind: the raw files that prepare cuts, verified.

:func:`fetch_corpus` sends a validated spec (:mod:`lmrepro.data.spec`) to its fetcher:
:func:`lmrepro.data.embedded.verify_installed` (read where it is installed),
:func:`lmrepro.data.enwik8.fetch_enwik8` (under ``cache_dir/enwik8/``) or
:func:`lmrepro.data.hf.fetch_hf_text` (under ``cache_dir/<name>/hf/<source>/``). Each keeps a
verified cache, so fetching again touches the network only for what is missing or damaged.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from lmrepro.data.embedded import verify_installed
from lmrepro.data.enwik8 import fetch_enwik8
from lmrepro.data.hf import fetch_hf_text
from lmrepro.data.spec import CorpusSpec, EmbeddedSpec, Enwik8Spec, corpus_key
from lmrepro.io import read_json

__all__ = ["fetch_corpus"]

log = logging.getLogger(__name__)


def fetch_corpus(name: str, spec: CorpusSpec, cache_dir: str | os.PathLike) -> dict[str, Any]:
    """Fetch (or verify the cache of) corpus ``name``; return what prepare needs, JSON-able.

    ``{"corpus", "kind", "spec" (every key, defaults filled in), "files": [[role, path], ...],
    "sha256": {role: digest}}`` where ``role`` is ``"all"`` for a single stream that prepare
    cuts by bytes/fractions, or ``"train"``/``"val"``/``"test"`` for per-split files.
    """
    key = corpus_key(name)
    log.info("fetch: corpus %s (%s) into %s", name, spec.kind, cache_dir)
    files: list[list[str]] = []
    digests: dict[str, str] = {}
    if isinstance(spec, EmbeddedSpec):
        path = Path(spec.path)
        files.append(["all", str(path)])
        digests["all"] = verify_installed(path, spec.sha256, corpus=name, param_prefix=key)
    elif isinstance(spec, Enwik8Spec):
        path = fetch_enwik8(spec, cache_dir, param_prefix=key)
        files.append(["all", str(path)])
        digests["all"] = read_json(path.with_name(f"{path.name}.json"))["sha256"]
    else:
        for role, split, budget in spec.roles():
            path = fetch_hf_text(spec, split=split, byte_budget=budget,
                                 cache_dir=Path(cache_dir) / name, corpus=name, param_prefix=key)
            files.append([role, str(path)])
            digests[role] = read_json(path.with_suffix(".json"))["sha256"]
    return {"corpus": name, "kind": spec.kind, "spec": spec.to_dict(), "files": files,
            "sha256": digests}
