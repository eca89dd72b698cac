"""The one way a table is shown: units in the headers, three significant figures, percentages for
relative differences, no index column, text that wraps to fit the page.

Every table of the reports goes through :func:`format_table` (what the cells say) and then
:func:`table_html` (the reports, :func:`show` in a notebook) or :func:`table_markdown` (the
README's "Results"). A column is formatted by its name (:data:`COLUMNS`): e.g.
``mean_step_time_s`` becomes "mean step time (ms)" with ``15.6``, ``mean_rel_diff`` becomes
"mean rel. diff. (%)" with ``+0.841``, ``peak_rss_bytes`` becomes "peak RSS (GiB)". The CSV files
under ``results/`` keep the raw numbers; only what a reader sees is formatted.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import pandas as pd

from lmrepro.pipeline import registry
from lmrepro.results import TOTAL

LONG_WORD = 40   # a text cell with a word longer than this gets the class "long" (wraps anywhere)
MISSING = "–"   # an empty cell: a number that does not exist (e.g. the seed-level bound of 1 seed)


def sig3(x: Any) -> str:
    """``x`` to three significant figures, thousands separated (``8,220``, ``0.0156``, ``1.00``);
    scientific below 0.001; a missing or non-finite number is :data:`MISSING`."""
    if x is None or isinstance(x, bool):
        return MISSING if x is None else str(x)
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if not math.isfinite(v):
        return MISSING
    if v == 0.0:
        return "0"
    if abs(v) < 1e-3:
        return f"{v:.2e}"
    digits = 2 - math.floor(math.log10(abs(v)))
    rounded = round(v, digits)
    if rounded != 0.0 and math.floor(math.log10(abs(rounded))) != math.floor(math.log10(abs(v))):
        digits -= 1          # 9.996 rounds to 10.0: keep three figures, not four
        rounded = round(v, digits)
    return f"{rounded:,.{max(0, digits)}f}"


def signed(text: str) -> str:
    """A leading ``+`` on a positive formatted number (relative differences read both ways)."""
    return text if text.startswith(("-", MISSING)) or text == "0" else "+" + text


def integer(x: Any) -> str:
    """A count, thousands separated."""
    if x is None or (isinstance(x, Real) and not math.isfinite(float(x))):
        return MISSING
    if isinstance(x, (Integral, float)) and float(x).is_integer():
        return f"{int(x):,}"
    return str(x)


def text(x: Any) -> str:
    """Text as is; a missing value is empty."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return str(x)


@dataclass(frozen=True)
class Column:
    """How a named column is shown: its header (with the unit) and its cell formatter."""

    header: str
    format: Callable[[Any], str]
    numeric: bool = True


def _scaled(factor: float, sign: bool = False) -> Callable[[Any], str]:
    def fmt(x: Any) -> str:
        if x is None or isinstance(x, str):
            return MISSING if x is None else x
        out = sig3(float(x) * factor)
        return signed(out) if sign else out
    return fmt


PERCENT = _scaled(100.0)
SIGNED_PERCENT = _scaled(100.0, sign=True)
MS = _scaled(1e3)
GIB = _scaled(1.0 / (1 << 30))
KB = _scaled(1e-3)
MILLIONS = _scaled(1e-6)

#: every column the reports show, by its name in the analysis's frames
COLUMNS: dict[str, Column] = {
    # runs
    "run": Column("run", text, False),
    "method": Column("method", text, False),
    "corpus": Column("corpus", text, False),
    "split": Column("split", text, False),
    "seed": Column("seed", integer),
    "seeds": Column("seeds", integer),
    "workers": Column("compute", text, False),
    "world_size": Column("workers", integer),
    "steps": Column("steps", integer),
    "tokens": Column("tokens", integer),
    "bytes": Column("bytes", integer),
    "n_params": Column("parameters (M)", MILLIONS),
    "final_bpb": Column("final eval (bits/byte)", sig3),
    "tokens_per_s": Column("throughput (tokens/s)", sig3),
    "mean_step_time_s": Column("mean step time (ms)", MS),
    "step_time_std_s": Column("step time s.d. (ms)", MS),
    "speedup": Column("per-step speed-up (x)", sig3),
    "throughput_ratio": Column("throughput ratio (x)", sig3),
    "wall_ratio": Column("wall-clock ratio (x)", sig3),
    "peak_rss_bytes": Column("peak RSS (GiB)", GIB),
    "peak_pss_bytes": Column("peak PSS (GiB)", GIB),
    "peak_uss_bytes": Column("peak USS (GiB)", GIB),
    "ratio_vs_baseline": Column("peak RSS ratio (x)", sig3),
    "memory_ratio": Column("peak RSS ratio (x)", sig3),
    "baseline": Column("baseline", text, False),
    "candidate": Column("candidate", text, False),
    # communication (the wings' byte kinds: byte_kind_column)
    TOTAL: Column("total (kB/step)", KB),
    "ratio_vs_dense": Column("bytes vs dense (%)", PERCENT),
    "dense": Column("dense run", text, False),
    # non-inferiority
    "comparison": Column("comparison", text, False),
    "pairs": Column("pairs (seed, batch)", integer),
    "mean_rel_diff": Column("mean rel. diff. (%)", SIGNED_PERCENT),
    "batch_upper_bound": Column("U, batch level (%)", SIGNED_PERCENT),
    "seed_upper_bound": Column("U, seed level (%)", SIGNED_PERCENT),
    "upper_bound": Column("U of the verdict (%)", SIGNED_PERCENT),
    "margin": Column("margin (%)", PERCENT),
    "level": Column("verdict from", text, False),
    "verdict": Column("verdict", text, False),
    "caveats": Column("caveats", text, False),
    "note": Column("note", text, False),
    # timing
    "candidate_step_time_s": Column("candidate step (ms)", MS),
    "candidate_step_time_spread_s": Column("candidate spread (ms)", MS),
    "baseline_step_time_s": Column("baseline step (ms)", MS),
    "baseline_step_time_spread_s": Column("baseline spread (ms)", MS),
    "relative_spread": Column("step-time spread (%)", PERCENT),
    "speedup_interval": Column("speed-up, run-level 95 % interval", text, False),
    "timing": Column("timing", text, False),
    # claims
    "id": Column("id", text, False),
    "paper": Column("paper", text, False),
    "claim": Column("claim", text, False),
    "paper_figure": Column("paper's figure", text, False),
    "paper_scale": Column("paper's scale", text, False),
    "measured": Column("ours", text, False),
    "our_scale": Column("our scale", text, False),
    "rule": Column("rule", text, False),
    # training-length studies (lmrepro.pipeline.length_study): the gap to a baseline
    "gap_mean": Column("mean gap (%)", SIGNED_PERCENT),
    "gap_lower": Column("L (%)", SIGNED_PERCENT),
    "gap_upper": Column("U (%)", SIGNED_PERCENT),
    "gap_batch_upper": Column("U, batch level (%)", SIGNED_PERCENT),
    "p_noninferior": Column("p, non-inferior", sig3),
    "p_worse": Column("p, worse", sig3),
    "diverged": Column("diverged", integer),
    "candidate_test_bpb": Column("candidate (bits/byte, test)", sig3),
    "testable": Column("testable", lambda x: MISSING if x is None or x != x
                       else "yes" if bool(x) else "no", False),
    "points": Column("points", integer),
    "slope_per_decade": Column("slope (% per decade)", SIGNED_PERCENT),
    "slope_low": Column("slope low (%)", SIGNED_PERCENT),
    "slope_high": Column("slope high (%)", SIGNED_PERCENT),
    "p_slope": Column("p, slope", sig3),
}


#: the columns a report shows of each of the analysis's tables (the CSV files keep them all)
PRESETS: dict[str, list[str]] = {
    "runs": ["run", "seed", "steps", "final_bpb", "tokens_per_s", "mean_step_time_s",
             "step_time_std_s", "peak_rss_bytes", "n_params"],
    "throughput": ["run", "seed", "workers", "steps", "tokens_per_s", "mean_step_time_s",
                   "step_time_std_s", "speedup", "throughput_ratio", "baseline"],
    "memory": ["run", "seed", "peak_rss_bytes", "ratio_vs_baseline", "baseline"],
    "noninferiority": ["comparison", "seeds", "pairs", "mean_rel_diff", "batch_upper_bound",
                       "seed_upper_bound", "level", "margin", "verdict", "caveats"],
    "timing": ["comparison", "seeds", "candidate_step_time_s", "candidate_step_time_spread_s",
               "baseline_step_time_s", "baseline_step_time_spread_s", "speedup",
               "throughput_ratio", "relative_spread", "speedup_interval", "timing",
               "memory_ratio", "caveats"],
    "claims": ["claim", "paper_figure", "paper_scale", "measured", "our_scale", "verdict",
               "caveats", "rule"],
}


def all_presets() -> dict[str, list[str]]:
    """:data:`PRESETS`, the communication table's (its columns: the wings' settings and byte
    kinds, :func:`lmrepro.pipeline.resources.communication_table`) and the wings'."""
    communication = ["run", "seed", *registry.settings(), "world_size", *registry.byte_kinds(),
                     TOTAL, "ratio_vs_dense"]
    return {**PRESETS, "communication": communication, **registry.presets()}


def _is_count(x: Any) -> bool:
    """An integer number (a count): an int, or a float without a fractional part; not a bool."""
    if isinstance(x, bool):
        return False
    return isinstance(x, Integral) or (isinstance(x, float) and x.is_integer())


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _plain(x: Any) -> str:
    """An unknown column's cell: three significant figures for a number, text as is."""
    return sig3(x) if isinstance(x, Real) and not isinstance(x, bool) else text(x)


def column(name: str, values: Sequence[Any] | None = None) -> Column:
    """The :class:`Column` of ``name``. An unknown one: its name in words, and its cells as
    counts (``2``, ``1,024``) when every number of ``values`` is an integer, else three
    significant figures (a count never reads ``2.00``); text as is, right-aligned only when
    the column holds numbers."""
    if name in COLUMNS:
        return COLUMNS[name]
    if name in (wings := registry.columns()):
        return wings[name]
    if name in (kinds := registry.byte_kinds()):
        return Column(f"{kinds[name]} (kB/step)", KB)
    header = name.replace("_", " ")
    present = [v for v in (values if values is not None else []) if not _missing(v)]
    numbers = [v for v in present if isinstance(v, Real) and not isinstance(v, bool)]
    if numbers and len(numbers) == len(present) and all(_is_count(v) for v in numbers):
        return Column(header, lambda x: MISSING if _missing(x) else integer(x), True)
    return Column(header, _plain, bool(numbers) or not present)


Columns = Sequence[str] | str | None


def format_table(df: pd.DataFrame, columns: Columns = None) -> pd.DataFrame:
    """``df`` (or its ``columns``, in that order; a string names a preset, :func:`all_presets`) as
    strings under headers with units; the index is dropped. Missing columns are an error naming
    them."""
    if isinstance(columns, str):
        presets = all_presets()
        if columns not in presets:
            raise KeyError(f"no preset {columns!r}: one of {sorted(presets)}")
        columns = presets[columns]
    names = list(df.columns if columns is None else columns)
    missing = [c for c in names if c not in df.columns]
    if missing:
        raise KeyError(f"columns {missing} are not in the table (it has {list(df.columns)})")
    cols = {c: column(c, df[c].tolist()) for c in names}
    out = pd.DataFrame({cols[c].header: [cols[c].format(v) for v in df[c]] for c in names})
    out.attrs["numeric"] = [cols[c].numeric for c in names]
    out.attrs["names"] = names
    return out


def table_html(df: pd.DataFrame, columns: Columns = None, *,
               caption: str = "") -> str:
    """An HTML table of :func:`format_table` (escaped; numbers right-aligned; class
    ``lmrepro-table``, styled by the reports to wrap and fit the page; a ``verdict`` cell also
    gets the class ``verdict-<verdict>``, e.g. ``verdict-not-reproduced``; a text cell with a
    word longer than :data:`LONG_WORD` characters, e.g. a checksum, the class ``long``)."""
    shown = format_table(df, columns)

    def cls(name: str, numeric: bool, value: str) -> str:
        out = "num" if numeric else "txt"
        if not numeric and any(len(word) > LONG_WORD for word in value.split()):
            out += " long"        # a checksum or a path: wraps anywhere, not out of its cell
        if name == "verdict" and value:
            out += " verdict-" + "-".join(re.findall(r"[a-z0-9]+", value.lower()))
        return out

    kinds = list(zip(shown.attrs["names"], shown.attrs["numeric"], strict=True))
    head = "".join(f"<th>{html.escape(h)}</th>" for h in shown.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td class=\"{cls(name, n, v)}\">{html.escape(v)}</td>"
                         for v, (name, n) in zip(row, kinds, strict=True)) + "</tr>"
        for row in shown.itertuples(index=False))
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (f"<div class=\"lmrepro-table\"><table>{cap}<thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table></div>")


def table_markdown(df: pd.DataFrame, columns: Columns = None) -> str:
    """A GitHub-flavoured Markdown table of :func:`format_table` (``|`` in cells escaped)."""
    shown = format_table(df, columns)

    def cell(v: str) -> str:
        return v.replace("|", "\\|").replace("\n", " ")

    numeric = shown.attrs["numeric"]
    lines = ["| " + " | ".join(cell(h) for h in shown.columns) + " |",
             "| " + " | ".join("---:" if n else "---" for n in numeric) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |"
              for row in shown.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def show(df: pd.DataFrame, columns: Columns = None, *, caption: str = "") -> None:
    """Display :func:`table_html` in a notebook."""
    from IPython.display import HTML, display

    display(HTML(table_html(df, columns, caption=caption)))
