"""Where `make test`'s pytest time goes: per module and the slowest tests, from a JUnit XML.

    PYTEST_ADDOPTS="--junitxml=/tmp/suite.xml" make test
    python scripts/bench_suite.py /tmp/suite.xml --wall 2607 --out docs/bench/suite.json

Writes the JSON (every test's seconds, per module, per directory) and prints the markdown tables
that docs/benchmarks.md ("Test suite") keeps. `--wall`: the whole `make test`'s seconds, as
measured around it (setup and forge included), for the header line.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def read(junit: Path) -> list[dict[str, object]]:
    """(module, test, seconds, outcome) of every test case in a pytest JUnit XML file."""
    root = ET.parse(junit).getroot()
    out = []
    for case in root.iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = tag
        module = case.get("classname", "").split(".")
        cpu = case.find("properties/property[@name='cpu_s']")
        # pytest's classname: tests.e2e.test_x (or tests.e2e.test_x.Class)
        path = "/".join(p for p in module if not p[:1].isupper()) + ".py"
        out.append(
            {
                "module": path,
                "test": case.get("name", ""),
                "seconds": round(float(case.get("time", "0") or 0), 2),
                "cpu_s": round(float(cpu.get("value", "0")), 2) if cpu is not None else None,
                "outcome": outcome,
            }
        )
    return out


def summarize(cases: list[dict[str, object]], top: int = 15) -> dict[str, object]:
    by_module: dict[str, float] = defaultdict(float)
    by_dir: dict[str, float] = defaultdict(float)
    cpu_by_dir: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for c in cases:
        m, s = str(c["module"]), float(c["seconds"])  # type: ignore[arg-type]
        by_module[m] += s
        d = "/".join(m.split("/")[:2])
        by_dir[d] += s
        cpu_by_dir[d] += float(c.get("cpu_s") or 0)  # type: ignore[arg-type]
        count[d] += 1
    slowest = sorted(cases, key=lambda c: -float(c["seconds"]))[:top]  # type: ignore[arg-type]
    modules = sorted(((m, round(s, 1)) for m, s in by_module.items()), key=lambda kv: -kv[1])
    return {
        "tests": len(cases),
        "seconds": round(sum(by_dir.values()), 1),
        "by_dir": {
            d: {"tests": count[d], "seconds": round(s, 1), "cpu_s": round(cpu_by_dir[d], 1)}
            for d, s in by_dir.items()
        },
        "by_module": dict(modules),
        "slowest": slowest,
    }


def table(s: dict[str, object], wall: float | None) -> str:
    lines = []
    if wall is not None:
        lines.append(f"`make test` from a fresh clone: {wall / 60:.1f} min wall in all.\n")
    lines += [
        f"pytest: {s['tests']} tests, {float(s['seconds']) / 60:.1f} min of test time.\n",  # type: ignore[arg-type]
        "| directory | tests | minutes | CPU minutes |",
        "|---|---:|---:|---:|",
    ]
    for d, v in sorted(s["by_dir"].items(), key=lambda kv: -kv[1]["seconds"]):  # type: ignore[union-attr]
        lines.append(f"| {d} | {v['tests']} | {v['seconds'] / 60:.1f} | {v['cpu_s'] / 60:.1f} |")
    lines += ["", "| slowest tests | s | CPU s |", "|---|---:|---:|"]
    for c in s["slowest"]:  # type: ignore[union-attr]
        cpu = "" if c.get("cpu_s") is None else f"{c['cpu_s']:.0f}"
        lines.append(f"| {c['module']}::{c['test']} | {c['seconds']:.0f} | {cpu} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", type=Path)
    ap.add_argument("--wall", type=float, default=None, help="make test's wall seconds")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not args.junit.is_file():
        print(f"bench_suite: no such file: {args.junit}", file=sys.stderr)
        return 2
    cases = read(args.junit)
    s = summarize(cases)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"wall_s": args.wall, **s, "cases": cases}, indent=1))
    print(table(s, args.wall))
    return 0


if __name__ == "__main__":
    sys.exit(main())
