from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.gossip_cluster import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    """Factory for node clusters; every child process is stopped (or killed) at teardown."""
    made: list[Cluster] = []

    def make(n: int, **kw: Any) -> Cluster:
        workdir = tmp_path / f"c{len(made)}"
        workdir.mkdir()
        c = Cluster(workdir, n, **kw)
        made.append(c)  # registered before spawning, so a failed start is still cleaned up
        c.spawn()
        return c

    yield make
    for c in made:
        c.close()
