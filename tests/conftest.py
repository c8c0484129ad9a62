"""Suite-wide collection order: longest first, by each test's seconds in the last measured run
(docs/bench/suite.json, `scripts/bench_suite.py`), then the tests marked slow, then as found.
`make test` spreads the suite over processes and pytest-xdist hands tests out in this order, so
the longest tests start at once and the short ones fill the gaps, instead of a long test
starting last and running alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

MEASURED = Path(__file__).resolve().parents[1] / "docs" / "bench" / "suite.json"
_CPU_AT_SETUP = pytest.StashKey[float]()


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


def _cpu_s() -> float:
    """This process's CPU seconds and those of its children that were waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_AT_SETUP] = _cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Each test's CPU seconds (setup to teardown, the worker and what it waited for) go into
    its report's properties, so a JUnit file says where the suite's CPU goes, not only its
    wall time (`scripts/bench_suite.py`): on 2 cores the suite is CPU-bound."""
    if call.when == "teardown" and _CPU_AT_SETUP in item.stash:
        item.user_properties.append(("cpu_s", round(_cpu_s() - item.stash[_CPU_AT_SETUP], 2)))
    yield
