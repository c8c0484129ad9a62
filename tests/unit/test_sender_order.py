"""Senders are ordered by address everywhere a decision depends on their order: the robust
screen's tie-break and the aggregate's canonical order, as the file formats and the contract
order them. Two addresses that first differ in letters of different case sort one way as
checksum strings and the other way as addresses; a node sorting one spelling and a referee
the other would exclude different members of a tie, and settle on different checkpoints."""

from __future__ import annotations

from eth_utils import to_checksum_address

from dtrain_node.optim import aggregate, robust
from dtrain_node.optim.robust import RobustConfig

A = to_checksum_address("0xab" + "00" * 19)
B = to_checksum_address("0xac" + "00" * 18 + "02")
H = to_checksum_address("0x" + "11" * 20)


def test_the_addresses_sort_apart_as_spellings() -> None:
    assert sorted([A, B]) == [B, A]  # the checksum spelling: "0xAC.." before "0xab.."
    assert aggregate.by_sender([(B, b""), (A, b"")]) == [(A, b""), (B, b"")]
    assert aggregate.by_sender([(2, b""), (10, b"")]) == [(2, b""), (10, b"")]  # int ids


def test_a_direction_tie_excludes_the_first_sender_by_address(monkeypatch) -> None:
    """H honest, A and B mirror images of each other: equal cosines to the rest, one is
    excluded (then too few are left to judge): the first by address, A, whatever the
    spelling or the order the packets arrive in."""
    vectors = {H: (10, 0), A: (2, 10), B: (2, -10)}

    def gram(spec, order):
        return [[[sum(x * y for x, y in zip(vectors[p], vectors[q], strict=True)) for q, _ in order]
                 for p, _ in order]]  # fmt: skip

    monkeypatch.setattr(robust, "gram", gram)
    monkeypatch.setattr(robust, "by_parameter", lambda spec, G: (G, ["w"]))
    monkeypatch.setattr(robust, "_norm_reason", lambda names, G, a, cfg: None)
    for packets in ([(A, b""), (B, b""), (H, b"")], [(H, b""), (B, b""), (A, b"")]):
        kept, out = robust.screen(None, packets, RobustConfig())  # type: ignore[arg-type]
        assert out == {A: "direction"} and [s for s, _ in kept] == [H, B]  # by address
