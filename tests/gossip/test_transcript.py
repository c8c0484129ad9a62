"""The transcript decides (docs/protocol.md 4.5), with real nodes in separate processes: however
the live rounds went (a member running ahead, one equivocating, one revealing to some peers
only, one withholding its packet), every node ends the epoch with the same canonical packets
in every round, and the members that did honest work are in it."""

from __future__ import annotations

from typing import Any

import pytest
from harness.gossip_cluster import account
from harness.split_attack_hook import ATTACK_ROUND

from dtrain_node.p2p import envelope
from dtrain_node.p2p.reconcile import Equivocation, check_equivocation

PACED = "harness.pace_hook"
SPLIT = "harness.split_attack_hook"
# rounds that end fast, and a reconcile that waits for the slowest member long enough
GOSSIP = {"round_deadline_s": 2.0, "settle_s": 1.0, "request_timeout_s": 1.0}


def _canonical(res: dict[str, Any]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    return [(tuple(r["senders"]), tuple(r["digests"])) for r in res["canonical"]["rounds"]]


def _live(res: dict[str, Any]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    return [(tuple(r["senders"]), tuple(r["digests"])) for r in res["rounds"]]


def _assert_one_transcript(results: list[dict[str, Any]]) -> None:
    first = _canonical(results[0])
    for res in results:
        assert res["canonical"]["settled"], res["address"]
        assert _canonical(res) == first, f"{res['address']} ends with another transcript"


def _attacked(cluster: Any, n: int, attack: str) -> tuple[Any, list[dict[str, Any]]]:
    """n members over 4 rounds, the last one running `attack` (harness.split_attack_hook):
    the cluster and the honest members' results."""
    c = cluster(
        n,
        rounds=4,
        params=100_000,
        gossip=GOSSIP,
        hooks={n - 1: SPLIT},
        extra={"reconcile": 60.0, "attack": attack},
    )
    c.start()
    return c, c.wait_done(list(range(n - 1)), timeout=180)


@pytest.mark.timeout(240)
def test_member_running_ahead_is_never_applied_alone_and_all_agree(cluster: Any) -> None:
    """Member 3 closes every round after 0.1 s and so runs ahead: it commits and reveals each
    round before the paced members begin it. The paced members still commit and apply each
    other's packets in every round (no round is one member's packet); member 3's own live
    rounds miss packets the others applied, and the end-of-epoch transcript puts every node,
    member 3 included, on the same packets: all four members in every round."""
    rounds = 6
    fast = {"round_deadline_s": 0.1, "settle_s": 0.1}
    c = cluster(
        4,
        rounds=rounds,
        params=200_000,
        gossip=GOSSIP,
        per_node={3: fast},
        hooks={0: PACED, 1: PACED, 2: PACED},
        # the others train 1 s per round: member 3 (0.2 s rounds) is always rounds ahead
        extra={"reconcile": 60.0, "pause_s": 1.0},
    )
    c.start()
    results = c.wait_done(timeout=180)
    members = sorted(c.members, key=str.lower)
    honest = sorted(c.members[:3], key=str.lower)
    for res in results[:3]:
        for r, (senders, _) in enumerate(_live(res)):
            assert set(honest) <= set(senders), f"round {r} at {res['address']}: {senders}"
    runner = _live(results[3])
    assert any(len(senders) < 4 for senders, _ in runner), runner  # its live rounds differed
    _assert_one_transcript(results)
    assert [s for s, _ in _canonical(results[0])] == [tuple(members)] * rounds


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [4, 7])
def test_equivocator_is_excluded_everywhere_with_a_proof(cluster: Any, n: int) -> None:
    """The last member commits to one packet, and after the honest reveals to another: every
    honest node ends with the same transcript, without it in the attacked round, and holds a
    proof of the equivocation that anyone can check; every honest member is in every round."""
    c, results = _attacked(cluster, n, "equivocate")
    attacker = c.members[n - 1]
    _assert_one_transcript(results)
    canon = [set(s) for s, _ in _canonical(results[0])]
    assert attacker not in canon[ATTACK_ROUND]
    assert all(set(c.members[: n - 1]) <= got for got in canon)
    for res in results:
        assert [ATTACK_ROUND, attacker] in res["canonical"]["equivocators"], res["address"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("n", "attack"),
    [(4, "late_to_some"), (7, "late_to_some"), (4, "withhold"), (7, "withhold")],
)
def test_selective_or_withheld_reveal_ends_in_one_transcript(
    cluster: Any, n: int, attack: str
) -> None:
    """The last member commits and reveals its packet only through its sync server to one
    member (late_to_some), or never (withhold). Either way every honest node ends with the same
    transcript: with its packet everywhere when one honest member got it, without it
    everywhere when nobody did."""
    c, results = _attacked(cluster, n, attack)
    attacker = c.members[n - 1]
    _assert_one_transcript(results)
    canon = [set(s) for s, _ in _canonical(results[0])]
    assert (attacker in canon[ATTACK_ROUND]) == (attack == "late_to_some")
    assert all(set(c.members[: n - 1]) <= got for got in canon)


def test_equivocation_proof_is_checked() -> None:
    """A proof convinces only with two signatures of its sender for one round and two packets."""
    kw = {"chain_id": 1, "contract": "0x" + "11" * 20, "job_id": 3, "epoch": 0, "round": 2}
    a = envelope.commitment(account(0), envelope.seal(account(0), payload=b"a" * 40, **kw))
    b = envelope.commitment(account(0), envelope.seal(account(0), payload=b"b" * 40, **kw))
    other = envelope.commitment(account(1), envelope.seal(account(1), payload=b"b" * 40, **kw))
    check_equivocation(Equivocation(2, account(0).address, a.encode(), b.encode()))
    bad = [
        Equivocation(2, account(0).address, a.encode(), a.encode()),  # one packet
        Equivocation(2, account(0).address, a.encode(), other.encode()),  # another signer
        Equivocation(3, account(0).address, a.encode(), b.encode()),  # another round
    ]
    for proof in bad:
        with pytest.raises(envelope.EnvelopeError):
            check_equivocation(proof)
