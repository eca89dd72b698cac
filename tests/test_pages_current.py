"""Every committed page is what ``lmrepro publish --pages-only`` writes today (issue 42): the
published runs' pages (``published/*/README.md``), the README's verdicts block and the docs'
generated sections. A change of the code that writes them, or of the claim rules, fails here
until the pages are regenerated (``lmrepro publish --pages-only``) and committed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lmrepro.pipeline.pages import BEGIN, END, regenerate

ROOT = Path(__file__).resolve().parents[1]


def _tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.split() if out.returncode == 0 else []


@pytest.mark.timeout(900)
def test_every_committed_page_is_what_publish_pages_only_writes(tmp_path: Path) -> None:
    files = _tracked("published", "docs", "README.md")
    if not files:
        pytest.skip("not a git checkout: the committed pages cannot be listed")
    for f in files:                  # the committed files only (no local results)
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, tmp_path / f)
    regenerate(tmp_path)
    pages = [f for f in files if f == "README.md" or f.startswith("docs/")
             or (f.startswith("published/") and f.endswith("/README.md"))]
    stale = [f for f in pages if (tmp_path / f).read_bytes() != (ROOT / f).read_bytes()]
    assert not stale, ("these committed pages differ from what `lmrepro publish --pages-only` "
                       f"writes: {stale}; run it and commit them")
    # every publication names the machine its runs were trained on (its verdicts row's
    # "trained" cell: "<n> cores of an <CPU>", or "machine not recorded" where unknown)
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index(BEGIN):readme.index(END)].splitlines()[3:]
    published = {p.name for p in (ROOT / "published").iterdir() if (p / "README.md").is_file()}
    assert {row.split("`")[1] for row in block} == published
    for row in block:
        trained = row.split(" | ")[2]
        assert " cores of an " in trained or "machine not recorded" in trained, row
