"""The one table formatter: units in the headers, three significant figures, percentages for
relative differences, no index column."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lmrepro.pipeline import tables as T


@pytest.mark.parametrize("value, expected", [
    (8217.6831, "8,220"), (0.015601, "0.0156"), (1.0, "1.00"), (0.49357, "0.494"),
    (3501056.0, "3,500,000"), (9.996, "10.0"), (99.96, "100"), (-0.0841, "-0.0841"),
    (0.00012345, "1.23e-04"), (0.0, "0"), (float("nan"), T.MISSING), (None, T.MISSING),
    (42, "42.0"), (123.456, "123"),
])
def test_three_significant_figures(value: float, expected: str) -> None:
    assert T.sig3(value) == expected


def test_columns_get_units_and_scaling() -> None:
    df = pd.DataFrame({"run": ["a", "b"], "mean_step_time_s": [0.015601, 0.0077],
                       "tokens_per_s": [8217.6831, 16648.5665],
                       "peak_rss_bytes": [690229248, 3 * (1 << 30)],
                       "mean_rel_diff": [0.0501, -0.0008], "upper_bound": [0.050835, None],
                       "sparsity": [0.9, 0.99], "grad_values": [171520.0, 1716.0],
                       "pairs": [246, 246]})
    out = T.format_table(df)
    assert list(out.columns) == ["run", "mean step time (ms)", "throughput (tokens/s)",
                                 "peak RSS (GiB)", "mean rel. diff. (%)", "U of the verdict (%)",
                                 "sparsity (%)", "gradient values (kB/step)",
                                 "pairs (seed, batch)"]
    assert out.iloc[0].tolist() == ["a", "15.6", "8,220", "0.643", "+5.01", "+5.08", "90.0",
                                    "172", "246"]
    assert out.iloc[1].tolist() == ["b", "7.70", "16,600", "3.00", "-0.0800", T.MISSING, "99.0",
                                    "1.72", "246"]
    # a chosen subset, in the chosen order; a column that is not there is named
    assert list(T.format_table(df, ["pairs", "run"]).columns) == ["pairs (seed, batch)", "run"]
    with pytest.raises(KeyError, match="nope"):
        T.format_table(df, ["nope"])


def test_html_has_no_index_escapes_and_aligns_numbers() -> None:
    df = pd.DataFrame({"comparison": ["scape@90% <p=2>"], "margin": [0.01]}, index=[7])
    page = T.table_html(df, caption="Non-inferiority")
    assert "<th>comparison</th><th>margin (%)</th>" in page
    assert "scape@90% &lt;p=2&gt;" in page and "<p=2>" not in page
    assert '<td class="num">1.00</td>' in page and ">7<" not in page
    assert page.startswith('<div class="lmrepro-table"><table><caption>Non-inferiority')


def test_markdown_table() -> None:
    df = pd.DataFrame({"claim": ["a | b"], "verdict": ["reproduced"], "speedup": [math.pi]})
    assert T.table_markdown(df) == ("| claim | verdict | per-step speed-up (x) |\n"
                                    "| --- | --- | ---: |\n"
                                    "| a \\| b | reproduced | 3.14 |\n")


def test_counts_in_unknown_columns_print_as_integers() -> None:
    """The placement tables printed process and thread counts as "2.00": a column whose numbers
    are all integers is a count; a column with a fraction keeps three figures; booleans and
    lists are text."""
    df = pd.DataFrame({"processes": [1, 2], "machine cores": [2.0, float("nan")],
                       "PSS ratio": [2.0, 1.51], "oversubscribed": [False, True],
                       "stages per process": [[[0, 1, 2, 3]], [[0, 1], [2, 3]]],
                       "big count": [1024, 3]})
    shown = T.format_table(df)
    assert list(shown["processes"]) == ["1", "2"]
    assert list(shown["machine cores"]) == ["2", T.MISSING]
    assert list(shown["PSS ratio"]) == ["2.00", "1.51"]
    assert list(shown["big count"]) == ["1,024", "3"]
    assert list(shown["oversubscribed"]) == ["False", "True"]
    assert shown.attrs["numeric"] == [True, True, True, False, False, True]
    html = T.table_html(df)
    assert '<td class="num">2</td>' in html and "2.00</td>" in html


def test_a_checksum_cell_wraps_inside_its_table() -> None:
    """01's sha256 spilled out of its table: a text cell with a word longer than LONG_WORD gets
    the class ``long``, which the reports' CSS wraps anywhere."""
    from lmrepro.pipeline.render import CSS

    html = T.table_html(pd.DataFrame({"file": ["data/x.txt"], "sha256": ["ab" * 32]}))
    assert '<td class="txt long">' + "ab" * 32 in html and '<td class="txt">data/x.txt' in html
    assert "td.long{overflow-wrap:anywhere" in CSS
