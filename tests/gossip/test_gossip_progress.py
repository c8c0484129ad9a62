"""Progress notes over real gossip between member processes: a member's genuine note is relayed,
and every forged, tampered, outsider's, other job's or junk note is dropped and counted by
every honest member (docs/protocol.md 4.8)."""

from __future__ import annotations

from typing import Any

import pytest
from harness.gossip_cluster import assert_identical_rounds

REASONS = {"bad_signature", "not_member", "other_job", "malformed"}


@pytest.mark.timeout(180)
def test_forged_progress_dropped_and_counted_genuine_relayed(cluster: Any) -> None:
    rounds, attacker = 6, 2
    c = cluster(
        3,
        rounds=rounds,
        payload_bytes=20_000,
        gossip={"round_deadline_s": 20.0},
        hooks={attacker: "harness.progress_attack_hook"},
    )
    c.start()
    results = c.wait_done(timeout=150)
    assert_identical_rounds(results, range(rounds))  # the rounds never noticed
    for res in results[:attacker]:
        m = res["metrics"]
        dropped = m["progress_dropped"]
        # forged in another's name, tampered, re-signed by an outsider: bad signatures; an
        # outsider's own note, another job's, random bytes (gossip may lose one: at most 6)
        assert set(dropped) == REASONS and sum(dropped.values()) <= 6, dropped
        assert m["progress_relayed"] == 1, m["progress_relayed"]  # the genuine note, once
