"""Suite-wide collection order: longest first, by each test's seconds in the last measured run
(docs/bench/suite.json, `scripts/bench_suite.py`), then the tests marked slow, then as found.
`make test` spreads the suite over processes and pytest-xdist hands tests out in this order, so
the longest tests start at once and the short ones fill the gaps, instead of a long test
starting last and running alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

MEASURED = Path(__file__).resolve().parents[1] / "docs" / "bench" / "suite.json"


def _seconds() -> dict[str, float]:
    try:
        cases = json.loads(MEASURED.read_text())["cases"]
    except (OSError, ValueError, KeyError):
        return {}
    return {f"{c['module']}::{c['test']}": float(c["seconds"]) for c in cases}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seconds = _seconds()
    items.sort(  # stable: equal keys stay as found
        key=lambda item: (
            -seconds.get(item.nodeid, 0.0),
            item.get_closest_marker("slow") is None,
        )
    )
