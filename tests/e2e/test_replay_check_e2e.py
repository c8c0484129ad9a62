"""End to end: a free-rider that re-sends its first packet every round is caught by replay spot
checks, and no honest member is ever accused (real anvil, node processes, libp2p and training).

The check rate is 1 here (every member checked every round by another one, drawn from the
shared state), so the test does not depend on the draw; the default is 0.1."""

from __future__ import annotations

import pytest

from dtrain.recipe import Recipe
from dtrain_node.devnet import Cluster
from dtrain_node.devnet.cluster import node_name
from dtrain_node.verify import claims, spotcheck

pytestmark = pytest.mark.slow

ROUNDS = 5


def _of(c: Cluster, n: int, kind: str) -> list[dict]:
    return [m for i in range(n) for m in c.metrics(i) if m["kind"] == kind]


@pytest.mark.timeout(900)
def test_a_stale_free_rider_fails_replay_and_no_honest_member_is_accused(
    tmp_path, monkeypatch
) -> None:
    """op4 (of 4) trains round 0 and then re-sends that packet every round without training.
    Every round each member's private state is fetched by the member the shared state assigns
    and replayed: every check of an honest member matches byte for byte, every check of op4
    after round 0 does not; the claims the checkers sign name op4 only, carry op4's own signed
    commitment and verify."""
    monkeypatch.setenv(spotcheck.RATE_ENV, "1")  # inherited by the node processes
    with Cluster(tmp_path, operators=4, epochs=1, steps=2 * ROUNDS, sync=2) as c:
        for i in range(3):
            c.spawn(i)
        c.spawn(3, ["stale"])
        c.wait(lambda: len(_of(c, 4, "epoch_trained")) == 4, 700, "every member to train")
        cheat = c.ops[3].address
        honest = {o.address for o in c.ops[:3]}
        checked = _of(c, 4, "replay_checked")
        # every (member, round) was assigned to one checker; each check ran and reported
        assert sorted((m["member"], m["round"]) for m in checked) == sorted(
            (o.address, r) for o in c.ops for r in range(ROUNDS)
        )
        for m in checked:
            assert m["bytes"] > 0 and m["replay_s"] > 0, m  # a state was fetched and replayed
            want = m["member"] in honest or m["round"] == 0
            assert m["match"] is want, m
        made = _of(c, 4, "replay_claim")
        assert sorted((m["member"], m["round"]) for m in made) == [
            (cheat, r) for r in range(1, ROUNDS)
        ]
        for m in made:
            claim = claims.decode(bytes.fromhex(m["claim"]))
            claims.verify(claim)
            assert claim.reason == claims.MISMATCH and claim.checker in honest | {cheat}
            assert claim.checker != cheat
        for i in range(4):  # claims are on disk under the job too, nothing else
            files = claims.load_all(c.tmp / node_name(i) / "jobs" / str(c.job_id) / "claims")
            assert {f.member for f in files} <= {cheat}


@pytest.mark.timeout(900)
def test_a_stale_free_rider_of_a_paper_mode_job_fails_replay(tmp_path, monkeypatch) -> None:
    """The same free-rider in a job whose recipe picks the DeMo paper's mode (a sync every
    step, no inner AdamW): a member's committed state is its error feedback and step count,
    and a replay recomputes its gradient on its batch. op3 (of 3) is caught from round 1 on,
    the honest members never."""
    monkeypatch.setenv(spotcheck.RATE_ENV, "1")
    recipe = tmp_path / "paper.toml"
    recipe.write_text(Recipe(demo_mode="paper", outer_lr=1e-3, outer_momentum=0.99).to_toml())
    rounds = 4
    with Cluster(tmp_path, operators=3, epochs=1, steps=rounds, sync=1, recipe=str(recipe)) as c:
        for i in range(2):
            c.spawn(i)
        c.spawn(2, ["stale"])
        c.wait(lambda: len(_of(c, 3, "epoch_trained")) == 3, 700, "every member to train")
        cheat = c.ops[2].address
        checked = _of(c, 3, "replay_checked")
        assert sorted((m["member"], m["round"]) for m in checked) == sorted(
            (o.address, r) for o in c.ops for r in range(rounds)
        )
        for m in checked:
            assert m["bytes"] > 0, m
            assert m["match"] is (m["member"] != cheat or m["round"] == 0), m
        made = _of(c, 3, "replay_claim")
        assert sorted((m["member"], m["round"]) for m in made) == [
            (cheat, r) for r in range(1, rounds)
        ]
