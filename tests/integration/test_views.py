"""The SDK's own view calls (`dtrain.views`) return what web3's contract calls return, for
every view of the BSM, on a chain with a running job, and fail the same way."""

from __future__ import annotations

from typing import Any

import pytest
from harness.chain import ETH, peer_key, spec
from harness.flaky_rpc import flaky_rpc
from web3.exceptions import ContractCustomError, ContractLogicError

from dtrain.client import BSM
from dtrain.errors import CONTRACT_ERRORS, DtrainError, TransactionFailed
from dtrain.views import Views, abi_type


def _argument(param: dict[str, Any], job: int, who: str) -> Any:
    kind = abi_type(param)
    if kind.endswith("]"):
        return []
    if kind == "address":
        return who
    if kind.startswith("uint") or kind.startswith("int"):
        return job if "job" in param["name"].lower() else 0
    if kind == "bytes32":
        return b"\x01" * 32
    if kind == "bool":
        return True
    if kind == "bytes":
        return b""
    raise AssertionError(f"no sample argument for {kind} {param['name']}")


def _outcome(call: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "value", call(*args)
    except (ContractCustomError, ContractLogicError, DtrainError) as exc:
        return "reverted", type(exc).__name__


def test_every_view_returns_what_web3_returns(bsm: BSM, as_account) -> None:
    ops = [as_account(i) for i in (1, 2, 3)]
    for i, op in enumerate(ops):
        op.register_operator(2 * ETH, peer_key(i), [], "")
    job = bsm.create_job(spec())
    for op in ops:
        op.join_job(job)
    views = [
        e
        for e in bsm.contract.abi
        if e["type"] == "function" and e["stateMutability"] in ("view", "pure")
    ]
    assert len(views) > 40
    values = 0
    for e in views:
        args = [_argument(p, job, ops[0].sender) for p in e["inputs"]]
        mine = _outcome(bsm._views.call, e["name"], *args)
        theirs = _outcome(lambda fn: fn.call(), bsm.contract.get_function_by_name(e["name"])(*args))
        if theirs[0] == "reverted":
            assert mine[0] == "reverted", (e["name"], mine)
            continue
        values += 1
        assert mine == theirs, e["name"]
        assert type(mine[1]) is type(theirs[1]), e["name"]
    assert values > 40
    assert bsm.job(job).members == tuple(op.sender for op in ops)


def test_a_reverting_call_raises_the_contracts_own_error(bsm: BSM) -> None:
    with pytest.raises(CONTRACT_ERRORS["UnknownJob"], match=str(10**6)):
        bsm._views.call("joinJob", 10**6)


def test_a_view_that_is_not_in_the_abi_or_given_wrong_arguments_is_refused(bsm: BSM) -> None:
    with pytest.raises(ValueError, match="no function 'nope'"):
        bsm._views.call("nope")
    with pytest.raises(TypeError, match="getJob takes 1 arguments, got 0"):
        bsm._views.call("getJob")


class _Answer:
    """A provider that answers every request with one fixed JSON-RPC response."""

    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response

    def make_request(self, method: str, params: Any) -> dict[str, Any]:
        return self.response


class _W3:
    def __init__(self, response: dict[str, Any]) -> None:
        self.provider = _Answer(response)


ABI = [
    {
        "type": "function",
        "name": "f",
        "stateMutability": "view",
        "inputs": [],
        "outputs": [{"name": "", "type": "uint256"}],
    }
]


@pytest.mark.parametrize(
    ("response", "raised", "says"),
    [
        ({"error": {"code": 3, "message": "execution reverted"}}, TransactionFailed, "reverted"),
        ({"error": {"code": -32000, "message": "header not found"}}, DtrainError, "refused"),
        ({"result": "0x12"}, DtrainError, "undecodable"),
        ({"id": 1}, DtrainError, "without a result"),
        ({"error": "busy"}, DtrainError, "refused"),
    ],
)
def test_what_a_broken_or_refusing_rpc_answers_is_a_typed_error(response, raised, says) -> None:
    views = Views(_W3(response), "0x" + "11" * 20, ABI)  # type: ignore[arg-type]
    with pytest.raises(raised, match=says):
        views.call("f")


def test_a_job_is_read_in_one_batched_request_with_the_same_result(bsm: BSM, as_account) -> None:
    ops = [as_account(i) for i in (1, 2)]
    for i, op in enumerate(ops):
        op.register_operator(2 * ETH, peer_key(i), [], "")
    job = bsm.create_job(spec(min_operators=2, max_operators=2))
    ops[0].join_job(job)
    at = bsm.w3.eth.block_number
    with flaky_rpc(bsm.w3.provider.endpoint_uri, drop_every=10**9) as (url, counts):
        via = BSM.attach(url, bsm.address)
        seen = counts["seen"]
        got = via.job(job, block=at)
        assert counts["seen"] - seen == 1  # six views, one request
    one_by_one = [
        bsm._view(name, job, block=at)
        for name in ("getMembers", "getPendingJoins", "epochDeadline", "revealDeadline")
    ]
    assert [list(got.members), list(got.pending_joins), got.deadline, got.reveal_deadline] == (
        one_by_one
    )
    assert got.members == (ops[0].sender,) and got == bsm.job(job, block=at)


def test_an_rpc_that_serves_no_batches_is_asked_one_request_at_a_time(bsm: BSM) -> None:
    job = bsm.create_job(spec())
    with flaky_rpc(bsm.w3.provider.endpoint_uri, drop_every=10**9, batches=False) as (url, n):
        via = BSM.attach(url, bsm.address)
        before = n["forwarded"]
        got = via.job(job)
        assert n["forwarded"] - before == 7  # the block number and six views
        assert n["refused_batches"] == 1
    assert got == bsm.job(job, block=got.block)
