"""scripts/bench_suite.py reads pytest's JUnit XML into per-directory and slowest-test tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_suite  # noqa: E402 (scripts/ is not a package)

XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.e2e.test_challenge_e2e" name="test_a" time="101.5"><properties>
<property name="cpu_s" value="40.5"/></properties></testcase>
<testcase classname="tests.unit.test_x.TestGroup" name="test_b" time="0.25"/>
<testcase classname="tests.unit.test_x" name="test_c" time="2.0"><failure message="x"/></testcase>
</testsuite></testsuites>"""


def test_the_suite_table_groups_by_directory_and_lists_the_slowest(tmp_path: Path, capsys) -> None:
    junit = tmp_path / "suite.xml"
    junit.write_text(XML)
    out = tmp_path / "suite.json"
    assert bench_suite.main([str(junit), "--wall", "600", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["tests"] == 3 and data["wall_s"] == 600
    assert data["by_dir"] == {
        "tests/e2e": {"tests": 1, "seconds": 101.5, "cpu_s": 40.5},
        "tests/unit": {"tests": 2, "seconds": 2.2, "cpu_s": 0.0},
    }
    assert [c["cpu_s"] for c in data["cases"]] == [40.5, None, None]  # older files: no CPU
    assert data["by_module"]["tests/unit/test_x.py"] == 2.2
    assert [c["outcome"] for c in data["cases"]] == ["passed", "passed", "failure"]
    printed = capsys.readouterr().out
    assert "10.0 min wall" in printed
    assert "| tests/e2e/test_challenge_e2e.py::test_a | 102 | 40 |" in printed
    assert printed.index("tests/e2e/test_challenge_e2e.py::test_a") < printed.index("test_c")


def test_a_missing_file_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    assert bench_suite.main([str(tmp_path / "nowhere.xml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
