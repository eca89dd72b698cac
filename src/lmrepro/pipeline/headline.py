"""Each stage's headline metrics: what ``dvc metrics show``, ``dvc metrics diff`` and ``dvc exp
show`` compare across commits and experiments.

A stage writes a folder ``metrics/<name>/`` (``train_<suite>`` for a training stage, the
analysed suite or study for an analysis stage: ``scape``, ``rgc``, ``scaling``,
``rgc_scaling``; ``claims``, ``steptime``; a DVC metric, ``cache: false``, tracked by git
beside ``params.yaml``: outside the ignored ``results/``, so each commit and each experiment
carries its own) of small JSON files, one per item: a run of a suite (over its seeds), a
non-inferiority comparison, a claim, a prediction. Every file uses the same few keys
(:data:`KEYS`), so ``dvc metrics show`` prints one row per item in a handful of columns, and
``dvc metrics diff`` one row per changed number. The long tables stay CSV under ``results/``.

The folder lies beside the ``results/`` folder that holds the stage's products (the project's
``metrics/`` for the pipeline; under the products' folder elsewhere, e.g. in a test), and is
rewritten whole: an item of another profile does not linger.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lmrepro.io import atomic_write_json

#: the keys of every headline file: final bits per byte (validation split, mean over seeds),
#: a comparison's mean relative difference and the bounds its verdict uses (percent), another
#: figure (a ratio or a fraction, as the claims table's ``measured_value``), the verdict
KEYS = ("bpb", "gap %", "lo %", "up %", "value", "verdict")
METRICS_DIR = "metrics"
NOT_RUN = "not run"
#: the one item of a stage with nothing to report in this profile
NOT_RUN_ITEM = {"verdict": NOT_RUN}


def metrics_dir(products: str | Path, stage: str) -> Path:
    """``metrics/<stage>`` beside the nearest ``results`` folder at or above ``products``
    (``products/metrics/<stage>`` when there is none)."""
    products = Path(products)
    for folder in (products, *products.parents):
        if folder.name == "results":
            return folder.parent / METRICS_DIR / stage
    return products / METRICS_DIR / stage


def _name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "item"


def rounded(value: Any, digits: int = 4) -> float | None:
    """``value`` to ``digits`` significant digits, as every headline file writes its figures;
    None for None and for a value that is not finite."""
    if value is None:
        return None
    value = float(value)
    return None if not math.isfinite(value) else float(f"{value:.{digits}g}")


def _percent(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(100 * value, 2)


def write_headline(folder: str | Path, items: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write one ``<item>.json`` per item into ``folder`` (keys of :data:`KEYS`, None values
    left out) and remove the folder's other JSON files; no item writes ``none.json`` with the
    verdict ``not run``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    items = dict(items) or {"none": NOT_RUN_ITEM}
    names = {}
    for item, values in items.items():
        unknown = set(values) - set(KEYS)
        assert not unknown, f"headline keys {sorted(unknown)} are not in {KEYS}"
        names[f"{_name(item)}.json"] = {k: values[k] for k in KEYS
                                        if values.get(k) is not None}
    for old in folder.glob("*.json"):
        if old.name not in names:
            old.unlink()
    for name, values in names.items():
        atomic_write_json(folder / name, values)
    return folder


def training_items(summaries: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """One item per run of a suite (its name; ``<corpus>-<name>`` with several corpora): the
    final validation bits per byte, the mean over its seeds."""
    groups: dict[tuple[str, str], list[float]] = {}
    for s in summaries:
        groups.setdefault((str(s["corpus"]), str(s["name"])), [])
        if s.get("final_bpb") is not None:
            groups[(str(s["corpus"]), str(s["name"]))].append(float(s["final_bpb"]))
    corpora = {c for c, _ in groups}
    return {(name if len(corpora) == 1 else f"{corpus}-{name}"):
            {"bpb": rounded(sum(v) / len(v)) if v else None}
            for (corpus, name), v in sorted(groups.items())}


def _run_name(label: str) -> str:
    return label.rsplit("/", 1)[-1]


def comparison_items(comparisons: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """One item per non-inferiority comparison (``<candidate>-vs-<baseline>``, by run name;
    the corpus first with several corpora): the mean gap and the verdict's bounds in percent,
    and the verdict (``diverged`` when the candidate did)."""
    comparisons = list(comparisons)
    corpora = {c.corpus for c in comparisons}
    out = {}
    for c in comparisons:
        name = f"{_run_name(c.candidate_runs[0])}-vs-{_run_name(c.baseline_runs[0])}"
        if len(corpora) > 1:
            name = f"{c.corpus}-{name}"
        out[name] = {"gap %": _percent(c.mean_rel_diff), "lo %": _percent(c.lower_bound),
                     "up %": _percent(c.upper_bound),
                     "verdict": "diverged" if c.mean_rel_diff is None else c.verdict}
    return out


def claim_items(table: Any) -> dict[str, dict[str, Any]]:
    """One item per row of the claims table (its ``id``; ``-2``, ``-3`` for a claim measured in
    several settings): a comparison's gap and bounds in percent (rows with ``lower``/``upper``
    columns), else its ``measured_value``; and the verdict."""
    out: dict[str, dict[str, Any]] = {}
    for _, row in table.iterrows():
        name, n = str(row["id"]), 1
        while name in out:
            n += 1
            name = f"{row['id']}-{n}"
        upper = row.get("upper")
        bounded = upper is not None and not (isinstance(upper, float) and math.isnan(upper))
        value = row["measured_value"]
        out[name] = ({"gap %": _percent(value), "lo %": _percent(row.get("lower")),
                      "up %": _percent(upper)} if bounded else {"value": rounded(value, 3)})
        out[name]["verdict"] = SHORT_VERDICTS.get(str(row["verdict"]), str(row["verdict"]))
    return out


#: the verdicts too long for a 120-column `dvc metrics show`, as the headline writes them
SHORT_VERDICTS = {"reproduced in direction only": "reproduced (direction)",
                  "consistent with the authors' logs": "consistent (authors' logs)",
                  "not measured in the authors' logs": "not in authors' logs"}


def study_items(gaps: Any, verdict: tuple[str, int]) -> dict[str, dict[str, Any]]:
    """A length study's verdict point (the ``gaps.csv`` rows of ``verdict``: size and steps):
    one item per candidate, ``<candidate>-vs-<baseline>``."""
    if gaps is None or not len(gaps):
        return {}
    rows = gaps[(gaps["size"] == verdict[0]) & (gaps["steps"] == verdict[1])]
    return {f"{r['candidate']}-vs-{r['baseline']}":
            {"gap %": _percent(r["mean"]), "lo %": _percent(r["lower"]),
             "up %": _percent(r["upper"]), "verdict": str(r["verdict"])}
            for _, r in rows.iterrows()}
