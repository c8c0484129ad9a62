"""Read-only calls to one contract, each function's selector and types taken from its ABI once.

web3's contract calls look the function up in the ABI and validate the whole ABI (one keccak
per function, 120 for the BSM) twice per call, and pass the request through its middleware: a
read of a job (seven calls) cost about 60 ms of CPU, most of it there, and an operator's node,
which reads the job every poll, spent most of its CPU on it. Here a call is an `eth_call`
encoded with eth-abi and sent through the same provider (its retries included), and its result
comes back as web3 returns it: one output as its value, several as a list, addresses
checksummed, arrays as lists and structs as tuples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eth_abi import decode, encode
from eth_utils import function_abi_to_4byte_selector, to_checksum_address
from web3 import Web3
from web3.types import RPCEndpoint

from .errors import RpcUnavailable, TransactionFailed, decode_revert

Block = int | str


def abi_type(param: dict[str, Any]) -> str:
    """The canonical type of an ABI parameter, structs spelled as tuples."""
    kind = str(param["type"])
    if not kind.startswith("tuple"):
        return kind
    inner = ",".join(abi_type(c) for c in param["components"])
    return f"({inner}){kind[len('tuple') :]}"


def _web3_shaped(param: dict[str, Any], value: Any) -> Any:
    kind = str(param["type"])
    if kind.endswith("]"):
        inner = {**param, "type": kind[: kind.rindex("[")]}
        return [_web3_shaped(inner, v) for v in value]
    if kind == "tuple":
        return tuple(_web3_shaped(c, v) for c, v in zip(param["components"], value, strict=True))
    if kind == "address":
        return to_checksum_address(value)
    return value


@dataclass(frozen=True)
class _Function:
    abi: dict[str, Any]
    selector: bytes
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


class Views:
    """`call(name, *args, block=...)` of the view functions in `abi` at `address`."""

    def __init__(self, w3: Web3, address: str, abi: Sequence[dict[str, Any]]) -> None:
        self._w3 = w3
        self._to = to_checksum_address(address)
        self._fns = {
            e["name"]: _Function(
                abi=e,
                selector=function_abi_to_4byte_selector(e),
                inputs=tuple(abi_type(p) for p in e["inputs"]),
                outputs=tuple(abi_type(p) for p in e["outputs"]),
            )
            for e in abi
            if e.get("type") == "function"
        }

    def abi(self, name: str) -> dict[str, Any]:
        return self._function(name).abi

    def _function(self, name: str) -> _Function:
        try:
            return self._fns[name]
        except KeyError:
            raise ValueError(f"the contract has no function {name!r}") from None

    def call(self, name: str, *args: Any, block: Block = "latest") -> Any:
        request = self._request(name, args, block)
        return self._result(name, self._w3.provider.make_request(*request))

    def calls(self, calls: Sequence[tuple[str, Sequence[Any]]], block: Block = "latest") -> list:
        """Several calls at one block, in one JSON-RPC batch where the provider sends batches
        (`send_batch`): one round trip, and one chance for a lossy RPC to spoil it, not one per
        call. One by one where it cannot."""
        requests = [self._request(name, args, block) for name, args in calls]
        send_batch = getattr(self._w3.provider, "send_batch", None)
        if send_batch is None or len(requests) < 2:
            answers = [self._w3.provider.make_request(*r) for r in requests]
        else:
            answers = send_batch(requests)
        return [self._result(name, a) for (name, _), a in zip(calls, answers, strict=True)]

    def _request(self, name: str, args: Sequence[Any], block: Block) -> tuple[RPCEndpoint, list]:
        fn = self._function(name)
        if len(args) != len(fn.inputs):
            raise TypeError(f"{name} takes {len(fn.inputs)} arguments, got {len(args)}")
        data = fn.selector + encode(list(fn.inputs), list(args))
        at = hex(block) if isinstance(block, int) else block
        return RPCEndpoint("eth_call"), [{"to": self._to, "data": "0x" + data.hex()}, at]

    def _result(self, name: str, answer: Any) -> Any:
        if not isinstance(answer, dict):
            raise RpcUnavailable(f"RPC answered eth_call of {name} with {type(answer).__name__}")
        if "error" in answer:
            raise _failure(name, answer["error"])
        result = answer.get("result")
        if not isinstance(result, str):
            raise RpcUnavailable(f"RPC answered eth_call of {name} without a result")
        fn = self._fns[name]
        try:
            values = decode(list(fn.outputs), bytes.fromhex(result.removeprefix("0x")))
        except Exception:  # a short or garbled answer: what a broken RPC returns
            raise RpcUnavailable(f"RPC answered eth_call of {name} with undecodable data") from None
        shaped = [_web3_shaped(p, v) for p, v in zip(fn.abi["outputs"], values, strict=True)]
        return shaped[0] if len(shaped) == 1 else shaped


def _failure(name: str, error: Any) -> Exception:
    """A revert as the contract's decoded error; anything else the RPC refused as unavailable."""
    if not isinstance(error, dict):
        return RpcUnavailable(f"RPC refused eth_call of {name}: {error!r}"[:300])
    message = str(error.get("message", ""))
    data = error.get("data")
    if isinstance(data, dict):
        data = data.get("data")
    if isinstance(data, str) and len(data) >= 10:
        return decode_revert(data)
    if "revert" in message.lower():
        return TransactionFailed(f"call {name} reverted: {message}"[:300])
    return RpcUnavailable(f"RPC refused eth_call of {name}: {message}"[:300])
