"""A member that commits, never reveals, and holds every sync request open until the asker's
timeout (docs/protocol.md 4.2): with real nodes in separate processes, its stalls cannot
stretch the honest members' rounds past their own deadline plus settle, and every honest node
ends every round without it and with each other."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

ROUNDS = 6
# A request timeout longer than the round's settle: each pull that waited on the staller's
# answer would run that far past the round's deadline.
GOSSIP = {"round_deadline_s": 3.0, "settle_s": 2.0, "request_timeout_s": 6.0}
BOUND_S = GOSSIP["round_deadline_s"] + GOSSIP["settle_s"]


@pytest.mark.timeout(300)
def test_a_member_that_withholds_and_stalls_sync_cannot_stretch_the_rounds(cluster: Any) -> None:
    n = 4
    staller = {"withhold_rounds": list(range(ROUNDS)), "stall_sync": True}
    c = cluster(n, rounds=ROUNDS, params=100_000, gossip=GOSSIP, per_node={n - 1: staller})
    c.start()
    results = c.wait_done(timeout=240)
    honest, attacker = results[: n - 1], results[n - 1]
    assert attacker["metrics"]["stalled_sync"] > 0  # it did hold the honest pulls open
    for res in honest:
        for r in res["rounds"]:
            assert c.members[n - 1] not in r["senders"]
            assert set(c.members[: n - 1]) <= set(r["senders"]), (res["address"], r)
        # Without a cap on each pull at the round's own deadline, every pull that waited on
        # the staller ran up to 6.5 s: the rounds took D + settle + 3 s and more.
        median = statistics.median(r["latency_s"] for r in res["rounds"])
        assert median < BOUND_S + 1.5, (res["address"], [r["latency_s"] for r in res["rounds"]])
    digests = {tuple(tuple(r["digests"]) for r in res["rounds"]) for res in honest}
    assert len(digests) == 1  # one view of every round among the honest nodes
