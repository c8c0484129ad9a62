"""The quickstart's stated sizes stay near what its commands produce."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_quickstart_corpus_size_is_what_cat_makes() -> None:
    """`cat README.md docs/*.md > corpus.txt`: the prose says about how big it is, within a
    factor of 1.5 of the real size (the docs grow; 150 kB once stood beside 466)."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    (stated,) = re.findall(r"own documentation, about (\d+) kB", text)
    size = sum(p.stat().st_size for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    assert 1 / 1.5 <= size / (int(stated) * 1000) <= 1.5, (stated, size)
