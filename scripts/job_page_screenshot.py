"""The job page after a devnet job, as docs/img/job-page.png.

A local devnet (`dtrain_node.devnet.cluster.Cluster`: anvil, the BSM with the devnet's
parameters, operator nodes as `dtrain node run` processes over libp2p) runs a 2-epoch CPT job
of the built-in tiny model with 3 operators; the third fabricates its checkpoint in the second
epoch, the last, and is slashed for it (the job still completes). Then the job's page (`dtrain
job watch JOB --web`, with every node's metrics) is opened in headless Chromium and saved as a
full-page screenshot. About a minute on 2 cores.

    .venv/bin/python scripts/job_page_screenshot.py [--out docs/img/job-page.png] [--keep DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the headless Chromium the page tests use

from harness.browser import chromium_page  # noqa: E402

from dtrain.jobpage import JobPage, JobPageServer  # noqa: E402
from dtrain_node.devnet.cluster import Cluster  # noqa: E402

JOB_TIMEOUT_S = 900.0
FABRICATOR = 2  # the third node fabricates in the second epoch (chain epoch 1)


def run_job(tmp: Path, out: Path) -> None:
    with Cluster(tmp, operators=3, epochs=2, steps=20, sync=5) as c:
        c.spawn(0)
        c.spawn(1)
        c.spawn(FABRICATOR, faults=["fabricate", "epoch=1"])
        c.wait(c.ended, JOB_TIMEOUT_S, f"job {c.job_id} to end")
        job = c.bsm.job(c.job_id)
        print(f"job {c.job_id} {job.state.status.name.lower()}; taking the screenshot")
        page = JobPage(c.bsm, c.job_id, [p.data_dir for p in c.procs])
        with JobPageServer(page, port=0) as server, chromium_page() as browser:
            browser.goto(server.url)
            browser.wait_for_selector("body[data-block]", timeout=30_000)
            browser.wait_for_selector("#loss-chart polyline.series", timeout=30_000)
            browser.screenshot(path=str(out), full_page=True)
    print(f"wrote {out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "job-page.png")
    ap.add_argument("--keep", type=Path, help="Run in DIR and keep the nodes' logs there.")
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
        run_job(a.keep, a.out)
    else:
        with tempfile.TemporaryDirectory(prefix="dtrain-jobpage-") as tmp:
            run_job(Path(tmp), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
