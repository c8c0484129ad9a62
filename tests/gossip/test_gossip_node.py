"""GossipNode API on two real libp2p hosts inside the test process (threads, loopback)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from harness.gossip_cluster import CHAIN_ID, CONTRACT, JOB_ID, account

from dtrain_node.p2p.host import GossipConfig, GossipError, GossipNode, RoundResult


@pytest.mark.timeout(60)
def test_empty_payload_publishes_nothing_and_both_agree(tmp_path: Path) -> None:
    members = [account(i).address for i in range(2)]
    nodes = [
        GossipNode(
            GossipConfig(tmp_path / f"n{i}", CHAIN_ID, CONTRACT, JOB_ID, round_deadline_s=1.0),
            account(i),
        )
        for i in range(2)
    ]
    with nodes[0] as a, nodes[1] as b:
        assert a.connect([(b.peer_key, b.listen_addrs)]) == [b.peer_key]
        b.connect([(a.peer_key, a.listen_addrs)])
        for n in (a, b):
            n.set_epoch(3, members, None)
        results: dict[int, list[RoundResult]] = {0: [], 1: []}

        def run(i: int, node: GossipNode) -> None:
            results[i].append(node.collect_round(0, b"packet from %d" % i))
            results[i].append(node.collect_round(1, b"" if i == 1 else b"second"))

        threads = [threading.Thread(target=run, args=(i, n)) for i, n in enumerate((a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        r0, r1 = results[0], results[1]
        assert (
            [p for p, _ in r0[0].packets]
            == sorted(members, key=str.lower)
            == [p for p, _ in r1[0].packets]
        )
        assert r0[1].missing == r1[1].missing == [members[1]]
        assert r0[1].packets == r1[1].packets == [(members[0], b"second")]
        assert a.participation() == b.participation() == {members[0]: 2, members[1]: 1}
        with pytest.raises(ValueError, match="rounds only go up"):
            a.collect_round(1, b"again")
    a.stop()  # idempotent after the context manager stopped it
    with pytest.raises(GossipError, match="not running"):
        a.metrics()


def test_collect_before_set_epoch_is_an_error(tmp_path: Path) -> None:
    cfg: Any = GossipConfig(tmp_path, CHAIN_ID, CONTRACT, JOB_ID, settle_s=2.5)
    with GossipNode(cfg, account(0)) as n, pytest.raises(GossipError):
        assert n.settle_s == 2.5
        n.collect_round(0, b"x")


def _three_with_a_late_member(
    tmp_path: Path, cfg: dict[str, float], late_s: float, rounds: int, patience_s: float = 0.0
) -> tuple[list[str], dict[int, list[RoundResult]], list[dict[str, Any]]]:
    """Three members on loopback; member 2 begins round 0 `late_s` after the others began.
    Returns the members, each node's round results and each node's metrics at the end."""
    members = [account(i).address for i in range(3)]
    nodes = [
        GossipNode(GossipConfig(tmp_path / f"n{i}", CHAIN_ID, CONTRACT, JOB_ID, **cfg), account(i))
        for i in range(3)
    ]
    for n in nodes:
        n.start()
    try:
        for n in nodes:
            n.connect([(o.peer_key, o.listen_addrs) for o in nodes if o is not n])
            n.set_epoch(0, members, None)
        results: dict[int, list[RoundResult]] = {i: [] for i in range(3)}
        started = threading.Event()

        def run(i: int, node: GossipNode) -> None:
            if i == 2:
                started.wait(10)
                time.sleep(late_s)
            else:
                started.set()
            for r in range(rounds):
                payload = b"round %d from %d" % (r, i)
                results[i].append(node.collect_round(r, payload, patience_s=patience_s or None))

        threads = [threading.Thread(target=run, args=(i, n)) for i, n in enumerate(nodes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return members, results, [n.metrics() for n in nodes]
    finally:
        for n in nodes:
            n.stop()


@pytest.mark.timeout(90)
def test_member_starting_after_the_commit_phase_is_missing_everywhere(tmp_path: Path) -> None:
    """Two-phase rounds: a member that begins round 0 after the others' commit deadline (and
    after their reveals reached it) does not commit; all three apply the same set, without it,
    in every round until it has caught up, and then with it."""
    cfg = {"round_deadline_s": 1.0, "settle_s": 1.0, "request_timeout_s": 1.0}
    # 2.5 s late: still training while the others revealed round 0
    members, results, _ = _three_with_a_late_member(tmp_path, cfg, 2.5, rounds=4)
    first = [[s for s, _ in results[i][0].packets] for i in range(3)]
    assert first == [sorted(members[:2])] * 3, first
    assert all(results[i][0].missing == [members[2]] for i in range(3))
    assert all(results[i][0].latency_s < 1.0 + 1.0 + 1.0 for i in range(2))  # no stall
    for r in range(4):  # every round: the same set everywhere
        assert len({tuple(results[i][r].packets) for i in range(3)}) == 1, r
    last = [[s for s, _ in results[i][3].packets] for i in range(3)]
    assert last == [sorted(members)] * 3, last


@pytest.mark.timeout(60)
def test_member_committing_after_the_others_closed_withdraws_and_all_agree(tmp_path: Path) -> None:
    """A member that begins round 0 after the others closed their commit phase, while they still
    wait in step 3 for it to close its own: its commitment is late at both, so it withdraws
    (does not reveal) and all three apply the round without it; round 1 has all three."""
    # rounds: C = 1.5 s; the others hold in step 3 until the late member closes (or C + 4 s).
    # (At C = 0.75 s a loaded machine began round 1 at one node more than C after the others.)
    cfg = {"round_deadline_s": 2.0, "settle_s": 4.0, "request_timeout_s": 1.0}
    # 3 s late: the others' commit deadline (1.5 s in) is long past
    members, results, metrics = _three_with_a_late_member(tmp_path, cfg, 3.0, rounds=2)
    first = [[s for s, _ in results[i][0].packets] for i in range(3)]
    assert first == [sorted(members[:2])] * 3, first
    assert metrics[2]["withdrawn"] == 1 and metrics[2]["commit_timeouts"] == 0
    assert all(m["dropped"].get("late_commit", 0) >= 1 for m in metrics[:2])
    second = [[s for s, _ in results[i][1].packets] for i in range(3)]
    assert second == [sorted(members)] * 3, second


@pytest.mark.timeout(90)
def test_a_live_member_that_has_not_begun_is_waited_for_up_to_the_patience(tmp_path: Path) -> None:
    """Member 2 begins round 0 4 s late, far past the others' commit deadline (0.75 s) and
    settle (1 s). It is alive and answers that it has not begun the round, so the others keep
    their commit phase open (patience 20 s): all three apply all three packets."""
    cfg = {"round_deadline_s": 1.0, "settle_s": 1.0, "request_timeout_s": 1.0}
    members, results, metrics = _three_with_a_late_member(tmp_path, cfg, 4.0, 2, patience_s=20)
    for r in range(2):
        got = [[s for s, _ in results[i][r].packets] for i in range(3)]
        assert got == [sorted(members)] * 3, (r, got)
    assert all(m["waited_for_behind"] > 0 for m in metrics[:2])
    assert results[0][0].latency_s > 3.0  # it did wait
