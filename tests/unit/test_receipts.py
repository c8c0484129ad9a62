"""A caller's receipt for a job's final checkpoint: only the job's caller, naming the final
checkpoint of this job on this chain and contract, confirms it; anything else is refused."""

from __future__ import annotations

import pytest
from eth_account import Account

from dtrain_node.errors import NoteError
from dtrain_node.operator.keep import RECEIPT_FILE, Keep
from dtrain_node.p2p.receipts import ReceiptBox, sign_receipt

CHAIN, CONTRACT, JOB = 31337, "0x" + "ab" * 20, 4
CKPT = bytes(range(32))
caller, stranger = Account.create(), Account.create()


def box() -> ReceiptBox:
    b = ReceiptBox(CHAIN, CONTRACT)
    b.expect(JOB, caller.address.lower(), CKPT)
    return b


def test_the_callers_receipt_of_the_final_checkpoint_confirms_the_job() -> None:
    assert box().check(sign_receipt(caller, CHAIN, CONTRACT, JOB, CKPT)) == JOB


@pytest.mark.parametrize(
    "receipt",
    [
        pytest.param(lambda: sign_receipt(stranger, CHAIN, CONTRACT, JOB, CKPT), id="stranger"),
        pytest.param(
            lambda: sign_receipt(caller, CHAIN, CONTRACT, JOB, bytes(32)), id="other-ckpt"
        ),
        pytest.param(lambda: sign_receipt(caller, CHAIN, CONTRACT, JOB + 1, CKPT), id="other-job"),
        pytest.param(lambda: sign_receipt(caller, 1, CONTRACT, JOB, CKPT), id="other-chain"),
        pytest.param(
            lambda: sign_receipt(caller, CHAIN, "0x" + "cd" * 20, JOB, CKPT), id="other-bsm"
        ),
        pytest.param(lambda: b"DTPN" + bytes(80), id="junk"),
    ],
)
def test_any_other_receipt_is_refused(receipt) -> None:
    with pytest.raises(NoteError):
        box().check(receipt())


def test_a_forged_signature_is_refused() -> None:
    data = bytearray(sign_receipt(caller, CHAIN, CONTRACT, JOB, CKPT))
    data[-40] ^= 1  # inside s
    with pytest.raises(NoteError):
        box().check(bytes(data))


class Host:
    """A transport that takes receipts (as GossipNode does), confirmed when told."""

    def __init__(self) -> None:
        self.expected: tuple | None = None
        self.done = False

    def expect_receipt(self, job_id: int, who: str, checkpoint: bytes) -> None:
        self.expected = (job_id, who, checkpoint)

    def receipt_confirmed(self, job_id: int) -> bool:
        return self.done


def _job():
    from types import SimpleNamespace

    return SimpleNamespace(id=JOB, state=SimpleNamespace(caller=caller.address, checkpoint=CKPT))


def test_keeping_ends_after_linger_once_confirmed_or_at_most_keep_final(tmp_path) -> None:
    host = Host()
    k = Keep.after(_job(), tmp_path, host, linger_s=10, keep_s=100)
    assert host.expected == (JOB, caller.address, CKPT)
    t0 = k.linger_until - 10
    assert not k.over(t0 + 5) and not k.over(t0 + 50)  # the caller has not confirmed
    assert k.over(t0 + 100)  # keep-final is the most
    host.done = True
    assert not k.over(t0 + 5)  # confirmed: the linger time still runs for anyone else
    assert k.over(t0 + 10) and (tmp_path / RECEIPT_FILE).is_file()
    host.done = False  # a restarted node: the receipt on disk still counts
    again = Keep.after(_job(), tmp_path, host, linger_s=10, keep_s=100)
    assert again.over(again.linger_until)


def test_a_transport_without_receipts_keeps_until_keep_final(tmp_path) -> None:
    k = Keep.after(_job(), tmp_path, object(), linger_s=1, keep_s=5)
    assert not k.over(k.linger_until) and k.over(k.keep_until)
