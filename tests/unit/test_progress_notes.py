"""Signed progress notes: what a member publishes each round, what a relaying member and a
caller's watcher accept (a forged, unsigned, tampered, other-job or non-member note is dropped
and counted), and the round lines with their ETA the caller sees."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from eth_account import Account

import dtrain.progress
from dtrain.progress import ProgressFeed, Refusal, RoundBook, refusal_summary, summary
from dtrain_node.errors import NoteError
from dtrain_node.operator.progress import note_body
from dtrain_node.p2p import notes
from dtrain_node.p2p.noteboard import NoteBoard
from dtrain_node.p2p.watch import WatchPeer

CHAIN, JOB = 31337, 7
CONTRACT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
MEMBER = Account.from_key("0x" + "11" * 32)
OUTSIDER = Account.from_key("0x" + "22" * 32)
GRPO_ROUND = {
    "job": JOB,
    "epoch": 0,
    "attempt": 0,
    "round": 2,
    "step": 6,
    "loss": 0.0009,
    "reward": 0.25,
    "accuracy": 0.125,
    "tokens": 512,
    "tokens_per_s": 100.0,
    "compute_s": 1.5,
    "sync_s": 0.5,
}


def progress(account=MEMBER, job=JOB, **changes) -> bytes:
    body = {**note_body(GRPO_ROUND, 5), "chain_id": CHAIN, "contract": CONTRACT, "job": job}
    return notes.sign(account, notes.PROGRESS, {**body, **changes}).encode()


def board() -> NoteBoard:
    config = SimpleNamespace(chain_id=CHAIN, contract=CONTRACT, job_id=JOB)
    state = SimpleNamespace(
        config=config,
        store=SimpleNamespace(members=(MEMBER.address,)),
        peer_id="me",
        account=MEMBER,
    )
    return NoteBoard(state)  # type: ignore[arg-type]


def gossip(b: NoteBoard, data: bytes) -> bool:
    return b.validate_gossip("a peer", SimpleNamespace(data=data))  # type: ignore[arg-type]


def test_a_grpo_round_note_carries_reward_and_accuracy_signed_by_its_member() -> None:
    note = notes.decode(progress())
    assert note.sender == MEMBER.address
    b = note.body
    assert (b["reward"], b["accuracy"], b["loss"], b["step"], b["tokens"]) == (
        0.25,
        0.125,
        0.0009,
        6,
        512,
    )
    assert (b["round"], b["rounds"], b["round_s"]) == (2, 5, 2.0)


def forged() -> bytes:
    """A note claiming the member as sender, signed by someone else."""
    good = notes.decode(progress())
    other = notes.sign(OUTSIDER, notes.PROGRESS, {**good.body})
    return dataclasses.replace(good, signature=other.signature).encode()


def tampered() -> bytes:
    data = progress()
    return data.replace(b'"loss":0.0009', b'"loss":0.0001')


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (forged, "bad_signature"),
        (tampered, "bad_signature"),
        (lambda: progress()[:-65], "malformed"),  # unsigned: no signature bytes
        (lambda: progress()[:-1] + b"\x00", "bad_signature"),
        (lambda: progress(job=JOB + 1), "other_job"),
        (lambda: progress(contract=OUTSIDER.address), "other_job"),
        (lambda: progress(account=OUTSIDER), "not_member"),
        (lambda: b"junk", "malformed"),
    ],
    ids=str.split("forged tampered unsigned bad-v other-job other-contract outsider junk"),
)
def test_a_bad_progress_message_is_dropped_and_counted(make, reason) -> None:
    b, good = board(), progress()
    assert gossip(b, good)  # the member's own note passes and is kept for late watchers
    assert not gossip(b, make())
    assert b.dropped == {reason: 1}
    assert list(b.progress) == [good]


def test_the_watcher_hands_on_only_member_notes_once() -> None:
    got: list[notes.Note] = []
    peer = WatchPeer(CHAIN, CONTRACT, JOB, got.append)
    peer.members = frozenset({MEMBER.address})
    good = progress()
    for data in (good, good, forged(), progress(account=OUTSIDER)):
        peer._accept(data)
    assert [n.sender for n in got] == [MEMBER.address]
    assert peer.dropped == {"bad_signature": 1, "not_member": 1}


def test_a_note_that_outruns_its_senders_membership_is_handed_on_when_it_is_known() -> None:
    """A new epoch's member's first note can come before the watcher read the new members:
    it is held, checked again when the members change, and handed on once."""
    got: list[notes.Note] = []
    peer = WatchPeer(CHAIN, CONTRACT, JOB, got.append)
    early, outsider = progress(), progress(account=OUTSIDER)
    assert not peer._accept(early) and not peer._accept(outsider)
    assert peer.dropped == {"not_member": 2} and got == []
    peer._set_members(frozenset({MEMBER.address}))
    assert [n.sender for n in got] == [MEMBER.address]
    assert peer.dropped == {"not_member": 1} and peer.received == {"held": 1}
    peer._accept(early)  # the same note again (asked of the member): not handed on twice
    peer._set_members(frozenset({MEMBER.address}))  # the outsider's stays held, counted once
    assert len(got) == 1 and peer.dropped == {"not_member": 1}
    assert summary({"received": dict(peer.received), "dropped": dict(peer.dropped)}) == (
        "1 signed progress notes (1 held for a new member), 1 dropped (not_member)"
    )


def test_a_non_finite_loss_cannot_be_signed_or_decoded() -> None:
    with pytest.raises(NoteError):
        progress(loss=float("nan"))
    good = progress()
    bad = good.replace(b'"loss":0.0009', b'"loss":NaN')
    with pytest.raises(NoteError, match="malformed"):
        notes.decode(bad)


def body(sender: str, rnd: int, epoch: int = 0, **extra) -> dict:
    b = {"epoch": epoch, "attempt": 0, "round": rnd, "step": 2 * (rnd + 1), "loss": 2.0}
    return {**b, "tokens": 100, "round_s": 10.0, "t": 1000.0 + 100 * epoch + 10 * rnd} | {
        "sender": sender,
        **extra,
    }


def test_round_lines_wait_for_every_member_or_the_next_round_and_give_the_job_eta() -> None:
    book = RoundBook(epochs=2, rounds=3, boundary_s=30.0)
    assert book.add(body("a", 0, reward=0.5, accuracy=0.0), members=2) == []
    [line] = book.add(body("b", 0, reward=1.0, accuracy=1.0), members=2)
    assert (line.round, line.reported, line.tokens_seen) == (0, 2, 200)
    assert line.metrics == {"reward": 0.75, "accuracy": 0.5}
    # 5 rounds left at 10 s, and 2 epoch ends at 30 s each
    assert line.eta_s == pytest.approx(5 * 10 + 2 * 30)
    text = line.text()
    assert "epoch 0 (epochs 0..1) round 1/3" in text
    assert "reward 0.7500" in text and "accuracy 0.5000" in text
    assert "ETA 1 min 50 s" in text
    assert book.add(body("a", 1), members=2) == []
    assert book.add(body("a", 2), members=2) == []  # b's note of round 1 may still come
    [late] = book.add(body("b", 1), members=2)  # it does, after a's note of round 2
    assert (late.round, late.reported) == (1, 2)
    assert [x.round for x in book.flush(members=2)] == [2]


def test_a_round_with_a_lost_note_is_shown_once_a_later_round_is_whole_or_two_on() -> None:
    book = RoundBook(epochs=2, rounds=4, boundary_s=30.0)
    assert book.add(body("a", 0), members=2) == []  # b's note of round 0 is lost
    assert book.add(body("a", 1), members=2) == []
    shown = book.add(body("b", 1), members=2)  # round 1 is whole: round 0 waits no longer
    assert [(x.round, x.reported) for x in shown] == [(0, 1), (1, 2)]
    assert book.add(body("b", 0), members=2) == []  # shown already: not twice
    assert book.add(body("a", 3), members=2) == []  # round 2's notes and b's of 3 are lost
    shown = book.add(body("a", 0, epoch=1), members=2)  # a later epoch: round 3 is done
    assert [(x.epoch, x.round, x.reported) for x in shown] == [(0, 3, 1)]
    shown = book.add(body("b", 0, epoch=1), members=2)
    assert [(x.epoch, x.round, x.reported) for x in shown] == [(1, 0, 2)]
    assert book.add(body("a", 1, epoch=1), members=2) == []
    shown = book.add(body("a", 3, epoch=1), members=2)  # two rounds on: round 1 is done
    assert [(x.epoch, x.round, x.reported) for x in shown] == [(1, 1, 1)]


class Chain:
    """A job of two members, "a" and "b", whose one epoch started at block 5 and which ended
    at block `ended` (it lists no members from then on); with `joined`, "a" sat alone before
    block 5. Its RPC fails while `down` is set (a loaded node's timeout)."""

    chain_id, address, down, head, ended, pruned = CHAIN, CONTRACT, False, 6, 10**9, False
    joined = False  # "a" took its seat before the epoch started

    def __init__(self) -> None:
        self.w3 = SimpleNamespace(eth=self)

    @property
    def block_number(self) -> int:
        if self.down:
            raise TimeoutError("rpc timed out")
        return self.head

    def job(self, job_id: int) -> SimpleNamespace:
        spec = SimpleNamespace(total_epochs=1, steps_per_epoch=6, sync_interval=2)
        return SimpleNamespace(spec=spec, members=self.members(job_id, self.block_number))

    def params(self) -> SimpleNamespace:
        return SimpleNamespace(start_grace=10, challenge_window=20)

    def events(self, start: int, end: int, names, job_id: int) -> list[SimpleNamespace]:
        assert names == ["EpochStarted"] and job_id == JOB and start <= end
        args = {"epoch": 0, "attempt": 0, "memberCount": 2}
        return [SimpleNamespace(block=5, args=args)] if start <= 5 <= end else []

    def members(self, job_id: int, block: int) -> tuple[str, ...]:
        if self.pruned and block < self.head:
            raise ValueError("missing trie node")  # a node that keeps only recent state
        if block < 5:  # open: the seats taken so far
            return ("a",) if self.joined else ()
        return ("a", "b") if block < self.ended else ()


class Peer:
    def __init__(self, *args) -> None:
        self.members: tuple[str, ...] = ()

    def set_members(self, members) -> None:
        self.members = tuple(members)

    def follow(self, specs) -> int:
        return 0


@pytest.fixture
def fake_peer(monkeypatch) -> None:
    monkeypatch.setattr(dtrain.progress, "_watch_module", lambda: SimpleNamespace(WatchPeer=Peer))
    monkeypatch.setattr(dtrain.progress, "peer_specs", lambda bsm, ops: [(b"k", a) for a in ops])


def test_a_failed_poll_keeps_the_members_and_a_line_precedes_its_last_point(fake_peer) -> None:
    chain, lines, shown = Chain(), [], []
    on_note = lambda b: shown.append(len(lines))  # noqa: E731 - lines shown when a point comes
    feed = ProgressFeed(chain, JOB, lines.append, on_note=on_note)  # type: ignore[arg-type]
    feed._refresh()
    chain.down = True
    feed._refresh()
    feed._notes.put(body("a", 0))
    feed._drain(0.0)
    assert lines == []  # round 1 still waits for b's note
    feed._notes.put(body("b", 0))
    feed._drain(0.0)
    assert [(x.reported, x.members) for x in lines] == [(2, 2)]
    assert shown == [0, 1]  # the page that shows b's point already shows the round's line


def test_a_feed_whose_polls_missed_the_whole_job_still_learns_its_members(fake_peer) -> None:
    chain, lines = Chain(), []
    chain.head = 3  # before the epoch started: no members yet
    feed = ProgressFeed(chain, JOB, lines.append)  # type: ignore[arg-type]
    feed._refresh()
    assert feed.peer.members == ()
    chain.head, chain.ended = 12, 11  # the next poll comes after the job ended: it lists none
    feed._refresh()
    assert feed.peer.members == ("a", "b")  # read at the block the epoch started
    assert feed._specs == [(b"k", "a"), (b"k", "b")]  # asked for the notes gossip dropped
    for sender in ("a", "b"):
        feed._notes.put(body(sender, 0))
    feed._drain(0.0)
    assert [(x.reported, x.members) for x in lines] == [(2, 2)]
    chain.head = 13
    feed._refresh()  # nothing new: the members stay
    assert feed.peer.members == ("a", "b") and feed._members == ("a", "b")


def test_the_gap_between_epochs_is_measured_for_the_eta() -> None:
    book = RoundBook(epochs=3, rounds=1, boundary_s=1000.0)
    book.add(body("a", 0, epoch=0), members=1)
    [line] = book.add(body("a", 0, epoch=1), members=1)  # t 1100 after t 1000
    assert book.boundary_s == 100.0
    assert line.eta_s == pytest.approx(1 * 10 + 2 * 100)


def test_refusals_are_summed_up_by_reason() -> None:
    assert refusal_summary([]) == ""
    two = [Refusal("0xa", "ask", "x"), Refusal("0xb", "ask", "y")]
    assert refusal_summary(two) == "2 operators refused: ask above price"
    mixed = [*two, Refusal("0xc", "preflight", "z")]
    assert refusal_summary(mixed) == (
        "3 operators refused: ask above price (2), failed pre-flight (1)"
    )


def test_an_outsiders_note_is_dropped_before_its_signature_is_recovered() -> None:
    """Junk from outsiders must be cheap: the member check comes before the ECDSA recovery."""
    b = board()
    junk = progress(account=OUTSIDER)[:-65] + b"\x01" * 64 + b"\x1b"  # a signature of nothing
    assert not gossip(b, junk)
    assert b.dropped == {"not_member": 1}
    with pytest.raises(NoteError, match="bad_signature"):
        notes.decode(junk)  # without the check first, the same bytes fail on the signature


def test_a_feed_on_a_pruned_node_still_learns_the_current_members(fake_peer) -> None:
    chain = Chain()
    chain.pruned, chain.head = True, 8  # the epoch started at block 5, state that old is gone
    feed = ProgressFeed(chain, JOB, lambda line: None)  # type: ignore[arg-type]
    feed._refresh()
    assert feed.peer.members == ("a", "b") and feed._members == ("a", "b")


def test_a_round_is_whole_only_when_every_member_its_epoch_started_with_reported(
    fake_peer,
) -> None:
    """The feed's last poll saw one seat taken; the next was held up (a slow dial) while the
    epoch started with two members and the first of them reported. That round waits for the
    second note, read against the epoch's start, not the one member the feed knew of."""
    chain, lines = Chain(), []
    chain.head, chain.joined = 4, True
    feed = ProgressFeed(chain, JOB, lines.append)  # type: ignore[arg-type]
    feed._refresh()
    assert feed._members == ("a",)
    chain.head = 6  # the epoch started at block 5; no poll since
    feed._notes.put(body("a", 0))
    feed._drain(0.0)
    assert lines == []  # before the fix: one line, "1/1 members"
    feed._notes.put(body("b", 0))
    feed._drain(0.0)
    assert [(x.reported, x.members) for x in lines] == [(2, 2)]


def test_a_note_waits_while_the_rpc_node_has_not_seen_its_epoch_start(fake_peer) -> None:
    chain, lines, points = Chain(), [], []
    chain.head, chain.joined = 4, True
    feed = ProgressFeed(chain, JOB, lines.append, on_note=points.append)  # type: ignore[arg-type]
    feed._refresh()
    feed._notes.put(body("a", 0))
    feed._drain(0.0)  # the RPC node is behind: block 5 is not there yet
    assert (lines, points, len(feed._held)) == ([], [], 1)
    chain.head = 6
    feed._refresh()
    feed._release()
    assert [p["sender"] for p in points] == ["a"] and lines == []
    feed._notes.put(body("a", 2))  # b's note of round 0 was lost: a note two rounds on shows it
    feed._drain(0.0)
    assert [(x.round, x.reported, x.members) for x in lines] == [(0, 1, 2)]
