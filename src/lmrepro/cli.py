"""The ``lmrepro`` command: a thin layer over the functions the notebooks call.

    lmrepro validate [--params params.yaml] [--profile NAME] [--write results/params.json]
    lmrepro notebook notebooks/03_train_baseline.ipynb [--reports reports] [-p key value ...]
    lmrepro train    [--params params.yaml] [--profile NAME]     # baseline; baseline.cli
    lmrepro install-corpus | fetch | prepare                     # see lmrepro.data.cli
    lmrepro train-scape ...                                      # torchrun; scape.train.worker
    lmrepro train-rgc ...                                        # rgc.cli
    lmrepro predict  [--model-params N ...] [--json]             # scape.steptime.predict_cli
    lmrepro authors-logs DIR --out CSV [--provenance JSON]      # Megatron logs; scape.authors.logs
    lmrepro report   [--reports reports]                         # reports/index.html
    lmrepro publish  [--dest published/<profile>] [--pages-only] # a finished run's products
    lmrepro timing-history published/<profile> ...               # record sessions' timings

Errors are one message, no traceback (docs/reliability.md): bad input (a parameter, the
parameter file, a damaged checkpoint, a run directory another process is writing) exits with
status 2 and names the parameter or file, the value and what is allowed; a failure of the
machine or the data (a full disk, a corrupt download, a NaN about to be written) exits with 1.
A notebook that fails with one of these errors is reported the same way (the notebook's
traceback is not repeated); any other failure keeps its full traceback.
"""

from __future__ import annotations

import argparse

from lmrepro.entry import ArgumentParser, execute, notebook_error


def _add_params_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--params", default="params.yaml", help="parameter file (default params.yaml)")
    p.add_argument("--profile", default=None,
                   help="profile in params.yaml (default: its 'profile')")


def _load_params(path: str, profile: str | None = None):
    """:func:`lmrepro.pipeline.params.load_params`, imported when a command reads the file (the
    whole schema, every installed wing's section)."""
    from lmrepro.pipeline.params import load_params

    return load_params(path, profile)


def _cmd_validate(args: argparse.Namespace) -> int:
    from lmrepro.io import atomic_write_json
    from lmrepro.pipeline.params import load_params

    params = load_params(args.params, args.profile)
    if args.write:
        # the resolved parameters of the active profile: what every pipeline stage depends on,
        # so editing another profile changes nothing downstream
        atomic_write_json(args.write, params.to_dict())
    print(f"{args.params}: every profile is valid; active profile {params.profile!r}")
    return 0


def _parse_value(text: str):
    import yaml

    return yaml.safe_load(text)


def _cmd_notebook(args: argparse.Namespace) -> int:
    from lmrepro.lifetime import bind_to_pipeline
    from lmrepro.pipeline.notebook import run_notebook

    bind_to_pipeline()      # under dvc repro: end with dvc, so no worker outlives the pipeline
    # the parameter file and profile are always injected, so every executed notebook records
    # which configuration it ran with
    parameters = {"params_file": args.params, "profile": args.profile}
    parameters.update({k: _parse_value(v) for k, v in (args.param or [])})
    # not validated here (that would load torch in this process too, ~2 s a stage): under
    # dvc repro the validate stage did it; a notebook's own ConfigError is reported in one line
    try:
        html = run_notebook(args.notebook, args.reports, parameters)
    except Exception as err:
        clean = notebook_error(err)
        if clean is None:
            raise
        raise clean from None
    print(html)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from lmrepro.pipeline.report import report_stage

    print(report_stage(args.params, args.reports, args.profile))
    return 0


def _cmd_publish(args: argparse.Namespace) -> int:
    from lmrepro.pipeline.pages import regenerate
    from lmrepro.pipeline.publish import publish

    if args.pages_only:
        for path in regenerate("."):
            print(f"pages: wrote {path}")
        return 0
    print(publish(".", args.dest, readme=args.readme))
    return 0


def _cmd_timing_history(args: argparse.Namespace) -> int:
    from lmrepro.pipeline.timing_history import record_profile

    for folder in args.profiles:
        for e in record_profile(folder, args.history).entries:
            ratios = ", ".join(f"{x:.3f}" for x in e.throughput_ratios)
            print(f"{args.history}: {e.profile} at {(e.commit or '?')[:8]}, {e.label}, "
                  f"suite {e.suite}, {e.machine.text()}: ratios {ratios}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    # every sub-command's parser is of the same class: one-line usage errors (entry)
    parser = ArgumentParser(prog="lmrepro", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="validate every profile of params.yaml")
    _add_params_args(p)
    p.add_argument("--write", default=None, metavar="JSON",
                   help="also write the active profile's resolved parameters to JSON")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("notebook", help="execute a notebook with papermill, render HTML")
    p.add_argument("notebook")
    _add_params_args(p)
    p.add_argument("--reports", default="reports")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"),
                   help="notebook parameter (VALUE parsed as YAML)")
    p.set_defaults(func=_cmd_notebook)

    p = sub.add_parser("report", help="write reports/index.html with provenance and citation")
    _add_params_args(p)
    p.add_argument("--reports", default="reports")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("publish", help="copy a finished run's small products (metrics, tables, "
                       "plots, reports, its dvc.lock; no checkpoints) to published/<profile>/, "
                       "write its page there and the README's verdicts from them")
    p.add_argument("--dest", default=None, help="default: published/<the run's profile>")
    p.add_argument("--readme", default="README.md", help="README whose verdicts to update")
    p.add_argument("--pages-only", action="store_true",
                   help="write every published page and the README's verdicts again from "
                        "published/ (after a change of the code that writes them; nothing is "
                        "copied, trained or analysed)")
    p.set_defaults(func=_cmd_publish)

    p = sub.add_parser("timing-history", help="record published profiles' sessions in the "
                       "timing history (publish does it for the profile it publishes)")
    p.add_argument("profiles", nargs="+", metavar="PROFILE_DIR",
                   help="published profile folders (published/<profile>)")
    p.add_argument("--history", default="published/timing_history.json",
                   help="the history file (default published/timing_history.json)")
    p.set_defaults(func=_cmd_timing_history)

    # the composition: the wings' vocabulary for the pipeline, and their subcommands
    import importlib

    from lmrepro.data import cli as data_cli
    from lmrepro.pipeline.registry import install
    from lmrepro.wings import WINGS

    install(WINGS)
    data_cli.register(sub, load_params=_load_params)
    for module in (m for wing in WINGS for m in wing.commands):
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return execute(build_parser().parse_args(argv))


