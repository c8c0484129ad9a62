"""Typed client of the DistributedTrainingBSM contract over web3.py.

Transactions are signed locally with eth-account. Nonces come from a per-(chain, sender) lock
and counter, so several threads can send from the same or different accounts at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Self

import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
from web3 import Web3
from web3.contract.contract import Contract, ContractFunction
from web3.exceptions import (
    ContractCustomError,
    ContractLogicError,
    ContractPanicError,
    TimeExhausted,
    TransactionNotFound,
    Web3RPCError,
)
from web3.types import RPCEndpoint, TxReceipt

from . import artifacts, stakes
from . import models as m
from .errors import (
    CONTRACT_ERRORS,
    ConfigError,
    DtrainError,
    InsufficientFunds,
    InvalidAmount,
    InvalidKey,
    NoContract,
    RpcUnavailable,
    TransactionFailed,
    WrongChain,
    decode_revert,
)
from .views import Views

log = logging.getLogger(__name__)

JOB_EVENTS = (
    "JobCreated",
    "JobEscrowedInToken",
    "JobCancelled",
    "JobDeclined",
    "CancelRequested",
    "JoinRequested",
    "LeaveRequested",
    "SeatDrawScheduled",
    "SeatsDrawn",
    "SeatNotDrawn",
    "VacancyDrawDeferred",
    "EpochStarted",
    "CheckpointCommitted",
    "CheckpointRevealed",
    "EpochFinalized",
    "EpochFailed",
    "OperatorPaid",
    "Slashed",
    "JobCompleted",
    "JobFailed",
    "JobAborted",
)

# Gas limit of a finalize sent without estimation: above finalizeEpoch at the 32-member cap
# (docs/gas.md). Estimating right after a deadline on a chain that mines only on transactions
# runs against the last block's time, from before the deadline.
FINALIZE_GAS = 6_000_000


def load_key(key: str) -> LocalAccount:
    """An account from a 0x-prefixed or bare 64-hex-digit private key."""
    text = key.strip()
    body = text.removeprefix("0x")
    if len(body) != 64 or any(c not in "0123456789abcdefABCDEF" for c in body):
        raise InvalidKey("private key must be 32 bytes of hex (64 hex digits, optional 0x)")
    try:
        return Account.from_key("0x" + body)
    except Exception as exc:  # e.g. zero or above the curve order
        raise InvalidKey(f"invalid private key: {exc}") from None


RPC_TRIES = 6  # a request refused, dropped or timed out is sent again, this many times in all
RPC_BACKOFF_S = 0.25  # doubling: 0.25, 0.5, 1, 2, 4 s between the tries (~8 s in all)
_RETRYABLE = (requests.ConnectionError, requests.Timeout, requests.HTTPError, ConnectionError)


class RetryingHTTPProvider(Web3.HTTPProvider):
    """An HTTP provider that sends a request again, with backoff, when the connection is
    refused or dropped, times out or answers an HTTP error, and says so in one log line:
    a long-running command (a node, a referee, `job watch`, `job submit --serve`) rides
    out an RPC hiccup instead of exiting on it."""

    def __init__(self, rpc_url: str, timeout: float) -> None:
        # web3 asks for the chain id before every call; it never changes under one endpoint
        super().__init__(
            rpc_url,
            request_kwargs={"timeout": timeout},
            exception_retry_configuration=None,
            cache_allowed_requests=True,
            cacheable_requests={RPCEndpoint("eth_chainId")},
        )

    def send_batch(self, requests: Sequence[tuple[RPCEndpoint, Any]]) -> list[Any]:
        """The answers to `requests`, sent as one JSON-RPC batch and retried as one request;
        in the order asked. An RPC that refuses batches is asked one request at a time."""
        data = self.encode_batch_rpc_request(list(requests))
        raw = self._make_request(RPCEndpoint("batch"), data)
        answer = self.decode_rpc_response(raw)
        if not isinstance(answer, list):  # one error object: batches are not served here
            return [self.make_request(method, params) for method, params in requests]
        if len(answer) != len(requests) or any(not isinstance(a, dict) for a in answer):
            raise RpcUnavailable(f"RPC answered a batch of {len(requests)} with {len(answer)}")
        return sorted(answer, key=lambda a: a.get("id") or 0)

    def _make_request(self, method: Any, request_data: bytes) -> bytes:
        for tries in range(1, RPC_TRIES + 1):
            try:
                return super()._make_request(method, request_data)
            except _RETRYABLE as exc:
                if tries == RPC_TRIES:
                    raise
                wait = RPC_BACKOFF_S * 2 ** (tries - 1)
                log.warning(
                    "RPC %s: %s failed (%s), try %d of %d in %.2f s",
                    self.endpoint_uri, method, type(exc).__name__, tries + 1, RPC_TRIES, wait,
                )  # fmt: skip
                time.sleep(wait)
        raise AssertionError("unreachable")


def connect(rpc_url: str, expected_chain_id: int | None = None, timeout: float = 10.0) -> Web3:
    """A Web3 on `rpc_url` that answered, optionally on the expected chain (its requests are
    retried: `RetryingHTTPProvider`)."""
    w3 = Web3(RetryingHTTPProvider(rpc_url, timeout))
    try:
        chain_id = w3.eth.chain_id
    except (requests.exceptions.RequestException, OSError, Web3RPCError, ValueError) as exc:
        raise RpcUnavailable(f"RPC {rpc_url} unreachable: {type(exc).__name__}") from None
    if expected_chain_id is not None and chain_id != expected_chain_id:
        raise WrongChain(f"RPC {rpc_url} serves chain {chain_id}, expected {expected_chain_id}")
    return w3


NonceKey = tuple[str, int, str]  # (RPC endpoint, chain id, sender)


class _Nonces:
    """Next nonce per (endpoint, chain id, sender), guarded by a per-sender lock. The endpoint
    is part of the key: two local chains share a chain id but not their nonces."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[NonceKey, threading.Lock] = {}
        self._next: dict[NonceKey, int] = {}

    def lock(self, key: NonceKey) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def take(self, key: NonceKey, chain_next: Callable[[], int]) -> int:
        if key not in self._next:
            self._next[key] = chain_next()
        n = self._next[key]
        self._next[key] = n + 1
        return n

    def forget(self, key: NonceKey | None = None) -> None:
        if key is None:
            self._next.clear()
        else:
            self._next.pop(key, None)


NONCES = _Nonces()


@dataclass(frozen=True)
class Receipt:
    tx_hash: str
    block: int
    gas_used: int
    fee: int  # wei paid for gas
    events: tuple[m.Event, ...]

    def first(self, name: str) -> m.Event:
        for e in self.events:
            if e.name == name:
                return e
        raise KeyError(name)

    def all(self, name: str) -> list[m.Event]:
        return [e for e in self.events if e.name == name]


class BSM:
    """A deployed DistributedTrainingBSM, optionally with a signing account."""

    def __init__(
        self,
        w3: Web3,
        address: str,
        account: LocalAccount | None = None,
        receipt_timeout: float = 120.0,
    ) -> None:
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.account = account
        self.receipt_timeout = receipt_timeout
        abi = artifacts.load().abi
        self.contract: Contract = w3.eth.contract(address=self.address, abi=abi)
        self._views = Views(w3, self.address, abi)
        self.chain_id = w3.eth.chain_id

    # ------------------------------------------------------------------ construction

    @classmethod
    def attach(
        cls,
        rpc_url_or_w3: str | Web3,
        address: str,
        key: str | LocalAccount | None = None,
        chain_id: int | None = None,
    ) -> BSM:
        """Connects to an existing BSM, checking the RPC, chain id and contract code."""
        w3 = connect(rpc_url_or_w3, chain_id) if isinstance(rpc_url_or_w3, str) else rpc_url_or_w3
        if not Web3.is_address(address):
            raise ConfigError(f"{address!r} is not an address")
        account = load_key(key) if isinstance(key, str) else key
        bsm = cls(w3, address, account)
        bsm.check_contract()
        return bsm

    @classmethod
    def deploy(
        cls,
        rpc_url_or_w3: str | Web3,
        key: str | LocalAccount,
        params: m.Params,
        views: str | None = None,
    ) -> BSM:
        """Deploys a new BSM with `params` from the shipped artifacts: first its two extensions
        (hooks, then views), then the BSM. `views`: the address of a views extension already
        deployed from the same artifacts, shared instead (extensions hold no state)."""
        w3 = connect(rpc_url_or_w3) if isinstance(rpc_url_or_w3, str) else rpc_url_or_w3
        account = load_key(key) if isinstance(key, str) else key
        art = artifacts.load()
        factory = w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
        deployer = cls.__new__(cls)
        deployer.w3, deployer.account, deployer.receipt_timeout = w3, account, 120.0
        deployer.chain_id = w3.eth.chain_id
        deployer.contract = factory  # only for error decoding while deploying

        def create(name: str, *args: Any) -> str:
            ext = artifacts.load_named(name)
            code = w3.eth.contract(abi=ext.abi, bytecode=ext.bytecode)
            return str(deployer._send(code.constructor(*args), value=0)["contractAddress"])

        if views is None:
            views = create(artifacts.VIEWS, create(artifacts.HOOKS))
        rc = deployer._send(factory.constructor(params.as_tuple(), _addr(views)), value=0)
        address = rc["contractAddress"]
        return cls(w3, address, account)

    def with_account(self, key: str | LocalAccount) -> BSM:
        """The same contract, signing as another account."""
        account = load_key(key) if isinstance(key, str) else key
        return BSM(self.w3, self.address, account, self.receipt_timeout)

    def check_contract(self) -> None:
        code = self.w3.eth.get_code(self.address)
        if len(code) == 0:
            raise NoContract(f"no contract at {self.address} on chain {self.chain_id}")
        try:
            self.contract.functions.MAX_OPERATORS_CAP().call()
            self.params()
        except Exception:
            raise NoContract(
                f"contract at {self.address} is not a DistributedTrainingBSM"
            ) from None

    @property
    def sender(self) -> str:
        if self.account is None:
            raise ConfigError("no key given: this action sends a transaction")
        return self.account.address

    # ------------------------------------------------------------------ transactions

    def _send(
        self, fn: ContractFunction | Any, value: int = 0, gas: int | None = None
    ) -> TxReceipt:
        sender = self.sender
        key = (str(getattr(self.w3.provider, "endpoint_uri", "")), self.chain_id, sender)
        tx: dict[str, Any] = {"from": sender, "value": value, "chainId": self.chain_id}
        try:
            tx["gas"] = gas if gas is not None else int(fn.estimate_gas(tx) * 1.2) + 20_000
        except (ContractCustomError, ContractLogicError, ContractPanicError) as exc:
            raise self._revert_error(exc) from None
        except Web3RPCError as exc:
            raise self._rpc_error(exc, value) from None
        except (requests.exceptions.RequestException, OSError) as exc:
            raise RpcUnavailable(f"RPC unreachable: {type(exc).__name__}") from None
        with NONCES.lock(key):
            tx["nonce"] = NONCES.take(
                key, lambda: self.w3.eth.get_transaction_count(sender, "pending")
            )
            signed = None
            try:
                built = fn.build_transaction(tx)
                signed = self.account.sign_transaction(built)  # type: ignore[union-attr]
                tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
            except Web3RPCError as exc:
                if not self._landed(signed):
                    NONCES.forget(key)
                    raise self._rpc_error(exc, value) from None
                tx_hash = signed.hash  # type: ignore[union-attr]
            except (ContractCustomError, ContractLogicError, ContractPanicError) as exc:
                NONCES.forget(key)
                raise self._revert_error(exc) from None
            except (requests.exceptions.RequestException, OSError) as exc:
                NONCES.forget(key)
                raise RpcUnavailable(f"RPC unreachable: {type(exc).__name__}") from None
        try:
            rc = self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=self.receipt_timeout)
        except TimeExhausted:
            raise TransactionFailed(
                f"no receipt for {tx_hash.hex()} within {self.receipt_timeout}s"
            ) from None
        if rc["status"] != 1:
            raise TransactionFailed(f"transaction {tx_hash.hex()} reverted")
        return rc

    def _landed(self, signed: Any) -> bool:
        """Did the chain get `signed` after all? A send whose answer was lost is sent again,
        and the node then refuses the copy ("already known", "nonce too low"): the
        transaction itself is in, under the hash it was signed with."""
        if signed is None:
            return False
        try:
            self.w3.eth.get_transaction(signed.hash)
        except (TransactionNotFound, Web3RPCError, requests.exceptions.RequestException, OSError):
            return False
        return True

    def _revert_error(self, exc: Exception) -> DtrainError:
        data = getattr(exc, "data", None)
        if isinstance(data, dict):
            data = data.get("data")
        if isinstance(exc, ContractCustomError) or (isinstance(data, str) and len(data) >= 10):
            return decode_revert(data)
        if isinstance(exc, ContractPanicError):
            return TransactionFailed(f"contract panicked: {exc}")
        return TransactionFailed(f"transaction reverted: {exc}")

    def _rpc_error(self, exc: Web3RPCError, value: int = 0) -> DtrainError:
        text = str(exc)
        if "insufficient funds" in text.lower():
            from .units import format_eth

            has = format_eth(self.w3.eth.get_balance(self.sender))
            sends = f"{format_eth(value)} plus gas" if value else "gas"
            return InsufficientFunds(
                f"account {self.sender} has {has}, cannot pay {sends}: send it ETH or use a "
                "funded key (`dtrain chain up` prints some)"
            )
        return TransactionFailed(f"RPC refused the transaction: {text[:200]}")

    def _transact(self, fn: ContractFunction, value: int = 0, gas: int | None = None) -> Receipt:
        rc = self._send(fn, value, gas)
        return Receipt(
            tx_hash="0x" + rc["transactionHash"].hex().removeprefix("0x"),
            block=rc["blockNumber"],
            gas_used=rc["gasUsed"],
            fee=rc["gasUsed"] * rc["effectiveGasPrice"],
            events=tuple(self._decode_logs(rc["logs"])),
        )

    def _call(self, fn: ContractFunction, block: int | str = "latest") -> Any:
        try:
            return fn.call(block_identifier=block)
        except (ContractCustomError, ContractLogicError, ContractPanicError) as exc:
            raise self._revert_error(exc) from None
        except (requests.exceptions.RequestException, OSError) as exc:
            raise RpcUnavailable(f"RPC unreachable: {type(exc).__name__}") from None

    def _view(self, name: str, *args: Any, block: int | str = "latest") -> Any:
        """A view of this contract by ABI name, as web3's call returns it (`views.Views`)."""
        try:
            return self._views.call(name, *args, block=block)
        except (requests.exceptions.RequestException, OSError) as exc:
            raise RpcUnavailable(f"RPC unreachable: {type(exc).__name__}") from None

    def _read(self, name: str, *args: Any, block: int | str = "latest") -> Any:
        """A view's result by ABI name: one output as its value, several as a dict by output
        name; structs become dicts by component name (see `_named`)."""
        return self._by_name(name, self._view(name, *args, block=block))

    def _reads(self, calls: Sequence[tuple[str, Sequence[Any]]], block: int | str) -> list[Any]:
        """`_read` of several views at one block, in one batch (`Views.calls`)."""
        try:
            results = self._views.calls(calls, block=block)
        except (requests.exceptions.RequestException, OSError) as exc:
            raise RpcUnavailable(f"RPC unreachable: {type(exc).__name__}") from None
        return [self._by_name(name, r) for (name, _), r in zip(calls, results, strict=True)]

    def _by_name(self, name: str, result: Any) -> Any:
        outputs = self._views.abi(name)["outputs"]
        if len(outputs) == 1:
            return _named(outputs[0], result)
        return {o["name"]: _named(o, v) for o, v in zip(outputs, result, strict=True)}

    def _decode_logs(self, logs: Iterable[Any]) -> Iterator[m.Event]:
        by_topic = self._event_topics()
        for log in logs:
            if Web3.to_checksum_address(log["address"]) != self.address or not log["topics"]:
                continue
            name = by_topic.get(HexBytes(log["topics"][0]))
            if name is None:
                continue
            decoded = getattr(self.contract.events, name)().process_log(log)
            yield m.Event(
                name=name,
                args=dict(decoded["args"]),
                block=log["blockNumber"],
                tx_hash=HexBytes(log["transactionHash"]).hex(),
                log_index=log["logIndex"],
            )

    def _event_topics(self) -> dict[HexBytes, str]:
        if not hasattr(self, "_topics"):
            topics = {}
            for item in self.contract.abi:
                if item["type"] == "event":
                    sig = f"{item['name']}({','.join(i['type'] for i in item['inputs'])})"
                    topics[HexBytes(Web3.keccak(text=sig))] = item["name"]
            self._topics = topics
        return self._topics

    # ------------------------------------------------------------------ operators and stake

    def register_operator(
        self,
        stake: int,
        peer_key: bytes,
        multiaddrs: list[str],
        hardware: str = "",
        min_price_per_epoch: int = 0,
    ) -> Receipt:
        f = self.contract.functions.registerOperator(
            _b32(peer_key), list(multiaddrs), hardware, min_price_per_epoch
        )
        try:
            return self._transact(f, stake)
        except InsufficientFunds:
            from .units import format_eth

            has = format_eth(self.w3.eth.get_balance(self.sender))
            least = format_eth(self.params().min_stake)
            raise InsufficientFunds(
                f"register needs {format_eth(stake)} of stake (at least {least}) plus gas; "
                f"account {self.sender} has {has}: send it ETH or use a funded key "
                "(`dtrain chain up` prints some)"
            ) from None

    def update_operator(
        self, peer_key: bytes, multiaddrs: list[str], hardware: str, min_price_per_epoch: int
    ) -> Receipt:
        f = self.contract.functions.updateOperator(
            _b32(peer_key), list(multiaddrs), hardware, min_price_per_epoch
        )
        return self._transact(f)

    def submit_attestation(self, verifier: str, evidence: bytes) -> Receipt:
        """Records the sender's TEE attestation: the allowed `verifier` checks `evidence` for
        the sender and its registered peer key (see dtrain.attestation for the signed kind)."""
        f = self.contract.functions.submitAttestation(_addr(verifier), bytes(evidence))
        return self._transact(f)

    def set_attestation_verifier(self, verifier: str, allowed: bool = True) -> Receipt:
        """Allows or disallows an attestation verifier (blueprint developer only)."""
        f = self.contract.functions.setAttestationVerifier(_addr(verifier), allowed)
        return self._transact(f)

    def stake(self, amount: int) -> Receipt:
        return self._transact(self.contract.functions.stake(), amount)

    def unstake(self, amount: int) -> Receipt:
        return self._transact(self.contract.functions.unstake(amount))

    def deregister(self) -> Receipt:
        return self._transact(self.contract.functions.deregisterOperator())

    def delegate(self, operator: str, amount: int) -> Receipt:
        return self._transact(self.contract.functions.delegate(_addr(operator)), amount)

    def undelegate(self, operator: str, amount: int) -> Receipt:
        return self._transact(self.contract.functions.undelegate(_addr(operator), amount))

    def withdraw_unbonded(self, operator: str) -> Receipt:
        return self._transact(self.contract.functions.withdrawUnbonded(_addr(operator)))

    def claim_rewards(self, operator: str) -> Receipt:
        return self._transact(self.contract.functions.claimRewards(_addr(operator)))

    def withdraw(self) -> Receipt:
        return self._transact(self.contract.functions.withdraw())

    # ------------------------------------------------------------------ payment tokens

    def create_job_with_token(self, spec: m.JobSpec, token: str, owner: str | None = None) -> int:
        """Creates a job priced in ERC-20 `token` (`spec.price_per_operator_epoch` in its base
        units); the sender pays `spec.escrow` of it and `owner` (default: the sender) owns the
        job. Approves the BSM first when the allowance is short. Returns the job id."""
        from . import erc20

        if spec.seat_bond == 0:
            spec = replace(spec, seat_bond=self.params().min_seat_bond)
        t = erc20.contract(self.w3, token)
        balance = int(self._call(t.functions.balanceOf(self.sender)))
        if balance < spec.escrow:
            raise erc20.InsufficientTokenBalance(
                f"{self.sender} holds {balance} of token {t.address}, the escrow is {spec.escrow}"
            )
        if int(self._call(t.functions.allowance(self.sender, self.address))) < spec.escrow:
            self._transact(t.functions.approve(self.address, spec.escrow))
        f = self.contract.functions.createJobWithToken(
            spec.as_tuple(), t.address, _addr(owner or self.sender)
        )
        return int(self._transact(f).first("JobCreated").args["jobId"])

    def check_create_job(self, spec: m.JobSpec, token: str | None = None) -> int:
        """What `create_job` (or `create_job_with_token` with `token`) would do, without
        sending anything: the contract's own checks, by estimating the transaction from the
        sender (its typed error when it would revert; `InsufficientFunds` when the sender
        cannot pay the escrow and gas). A token job first needs the token allowed and the
        escrow in the sender's balance; when its allowance to the BSM is short (the real call
        approves first) the creation cannot be estimated before that approval, and 0 is
        returned after those checks. Else the gas estimate."""
        from . import erc20

        if spec.seat_bond == 0:
            spec = replace(spec, seat_bond=self.params().min_seat_bond)
        tx: dict[str, Any] = {"from": self.sender, "value": 0}
        if token is None:
            fn = self.contract.functions.createJob(spec.as_tuple())
            tx["value"] = spec.escrow
        else:
            t = erc20.contract(self.w3, token)
            if not self.is_payment_token(t.address):
                raise CONTRACT_ERRORS["TokenNotAllowed"](t.address)
            balance = int(self._call(t.functions.balanceOf(self.sender)))
            if balance < spec.escrow:
                raise erc20.InsufficientTokenBalance(
                    f"{self.sender} holds {balance} of token {t.address}, the escrow is "
                    f"{spec.escrow}"
                )
            if int(self._call(t.functions.allowance(self.sender, self.address))) < spec.escrow:
                return 0
            fn = self.contract.functions.createJobWithToken(spec.as_tuple(), t.address, self.sender)
        try:
            return int(fn.estimate_gas(tx))
        except (ContractCustomError, ContractLogicError, ContractPanicError) as exc:
            raise self._revert_error(exc) from None
        except Web3RPCError as exc:
            raise self._rpc_error(exc, tx["value"]) from None
        except (requests.exceptions.RequestException, OSError) as exc:
            raise RpcUnavailable(f"RPC unreachable: {type(exc).__name__}") from None

    def set_payment_token(self, token: str, allowed: bool = True) -> Receipt:
        """Allows `token` for new jobs (or stops allowing it); blueprint developer only."""
        return self._transact(self.contract.functions.setPaymentToken(_addr(token), allowed))

    def withdraw_token(self, token: str) -> Receipt:
        """Sends the sender all its credit in `token`."""
        return self._transact(self.contract.functions.withdrawToken(_addr(token)))

    def token_credit_of(self, token: str, account: str) -> int:
        return int(self._view("tokenCreditOf", _addr(token), _addr(account)))

    def pending_token_rewards(self, token: str, operator: str, account: str) -> int:
        return int(self._view("pendingTokenRewards", _addr(token), _addr(operator), _addr(account)))

    def token_accounting(self, token: str) -> m.TokenAccounting:
        return m.TokenAccounting.from_struct(self._read("tokenAccounting", _addr(token)))

    def job_token(self, job_id: int) -> str | None:
        """The token job `job_id` is priced in; None for ether."""
        a = str(self._view("jobToken", job_id))
        return None if int(a, 16) == 0 else a

    def is_payment_token(self, token: str) -> bool:
        return bool(self._view("isPaymentToken", _addr(token)))

    def payment_tokens(self) -> list[str]:
        return [str(a) for a in self._view("paymentTokens")]

    # ------------------------------------------------------------------ asks per unit

    def update_ask(self, ask: int, token: str | None = None) -> Receipt:
        """Sets the sender's ask: the least price per operator-epoch of a job it joins, in wei
        (`token` None) or in base units of the allowed payment `token` (TokenNotAllowed
        otherwise). Other units' asks stay."""
        most = 2**96 - 1 if token is None else 2**248 - 1  # what the contract stores
        if not 0 <= ask <= most:
            raise InvalidAmount(f"ask {ask} is outside 0..{most}")
        return self._transact(self.contract.functions.updateAsk(_unit(token), ask))

    def ask_in(self, operator: str, token: str | None = None) -> int | None:
        """`operator`'s ask in `token` (None: ether); None when it takes no job priced in that
        token (it set no ask there and asks something in ether)."""
        takes, ask = self._view("askIn", _addr(operator), _unit(token))
        return int(ask) if takes else None

    def asks(self, operator: str) -> dict[str | None, int | None]:
        """`operator`'s ask in ether (key None) and in each allowed payment token."""
        units: list[str | None] = [None]
        units += [t for t in self.payment_tokens() if self.is_payment_token(t)]
        return {u: self.ask_in(operator, u) for u in units}

    # ------------------------------------------------------------------ jobs

    def create_job(self, spec: m.JobSpec) -> int:
        """Creates a job escrowing `spec.escrow`; returns its id. A `seat_bond` of 0 asks for
        the deployment's `min_seat_bond` (read from `params()`)."""
        if spec.seat_bond == 0:
            spec = replace(spec, seat_bond=self.params().min_seat_bond)
        rc = self._transact(self.contract.functions.createJob(spec.as_tuple()), spec.escrow)
        return int(rc.first("JobCreated").args["jobId"])

    def cancel_job(self, job_id: int) -> Receipt:
        """Ends a job, its unearned escrow credited to its caller. An `Open` job: `JobCancelled`
        when the sender is the caller; `JobFailed` when anyone else ends a job that started and
        has since waited `open_timeout` for members (before that: `OpenTimeoutPending`). A
        `Running` job (caller only, once: `CancelAlreadyRequested`): `CancelRequested`; the epoch
        in progress still settles as usual (members paid or slashed), then the finalize that
        ends it closes the job `Cancelled` and refunds the rest of the escrow to the wei
        (`JobCancelled`), or completes it if it was the last epoch. An ended job: `JobEnded`."""
        return self._transact(self.contract.functions.cancelJob(job_id))

    def cancel_requested(self, job_id: int) -> bool:
        """Whether the job's caller asked it to end at its current epoch's boundary."""
        return bool(self._view("cancelRequested", job_id))

    def join_job(self, job_id: int) -> Receipt:
        return self._transact(self.contract.functions.joinJob(job_id))

    def decline_job(self, job_id: int, reason: str, detail: str) -> Receipt:
        """Says on chain why the sender (a registered operator) will not take the job
        (`JobDeclined`: `reason` a short code, `detail` at most 256 bytes of UTF-8, cut to
        fit), so the caller reads it after the operator's node is gone."""
        cut = detail.encode()[:256].decode(errors="ignore")
        f = self.contract.functions.declineJob(job_id, _b32(reason.encode().ljust(32, b"\0")), cut)
        return self._transact(f)

    def leave_job(self, job_id: int) -> Receipt:
        return self._transact(self.contract.functions.leaveJob(job_id))

    def commit_checkpoint(self, job_id: int, epoch: int, commitment: bytes) -> Receipt:
        """Commits the sender's hidden vote before the epoch's deadline; `commitment` is
        `dtrain.commitment_hash(job_id, epoch, sender, checkpoint, participation, salt)`."""
        f = self.contract.functions.commitCheckpoint(job_id, epoch, _b32(commitment))
        return self._transact(f)

    def reveal_checkpoint(
        self,
        job_id: int,
        epoch: int,
        checkpoint: bytes,
        participation: Sequence[int],
        transcript: bytes,
        salt: bytes,
        gas: int | None = None,
    ) -> Receipt:
        """Reveals the committed vote: after the commit deadline (or once every member
        committed) and until `reveal_deadline`. `checkpoint` may be `dtrain.UNWORKABLE`;
        `transcript` is the sha256 of the transcript file the vote was made from (zero bytes:
        none), what a challenge's referees judge the vote against.

        With `gas`, the transaction is sent without estimation (see `finalize_epoch`): right
        after the deadline, a chain that mines only on transactions would estimate against a
        block from before it and refuse with `RevealNotOpen`.
        """
        f = self.contract.functions.revealCheckpoint(
            job_id,
            epoch,
            _b32(checkpoint),
            [int(p) for p in participation],
            _b32(transcript),
            _b32(salt),
        )
        return self._transact(f, gas=gas)

    def finalize_epoch(self, job_id: int, epoch: int, gas: int | None = None) -> Receipt:
        """Settles the epoch; the sender earns the reporter bounty of any slash.

        With `gas`, the transaction is sent without estimation: a chain that mines only on
        transactions estimates against a stale block time, before the deadline it has passed.
        """
        return self._transact(self.contract.functions.finalizeEpoch(job_id, epoch), gas=gas)

    def report_equivocation(self, job_id: int, first: bytes, second: bytes) -> Receipt:
        """Proves that a member of the job's current epoch attempt signed two different packets
        for one round: `first` and `second` are the two encoded gossip envelopes. The member
        is slashed at the fabrication rate and not paid when the epoch settles."""
        f = self.contract.functions.reportEquivocation(job_id, bytes(first), bytes(second))
        return self._transact(f)

    # ------------------------------------------------------------------ challenges

    def challenge(
        self, job_id: int, epoch: int, transcript: bytes, gas: int | None = None
    ) -> Receipt:
        """Disputes the certified vote of the job's current attempt, bonding the deployment's
        `challenge_bond` in ether; `transcript` is the sha256 of the epoch's transcript file
        the sender serves to the referees. `gas`: send without estimation."""
        bond = self.params().challenge_bond
        f = self.contract.functions.challenge(job_id, epoch, _b32(transcript))
        return self._transact(f, value=bond, gas=gas)

    def post_transcript(
        self, job_id: int, epoch: int, transcript: bytes, gas: int | None = None
    ) -> Receipt:
        """A voter of the challenged attempt names the transcript file it serves (sha256):
        the referees re-execute the union of every posted file's packets."""
        f = self.contract.functions.postTranscript(job_id, epoch, _b32(transcript))
        return self._transact(f, gas=gas)

    def draw_referees(self, job_id: int, epoch: int, gas: int | None = None) -> Receipt:
        """Draws the challenge's referees among the outsiders registered when the job was
        created, by capped self-stake (the lesser of then and at the challenge), from the hash
        of the block after the challenge; anyone may, once that block is mined
        (`challenge_of(attempt).seed_block`)."""
        return self._transact(self.contract.functions.drawReferees(job_id, epoch), gas=gas)

    def commit_verdict(
        self, job_id: int, epoch: int, commitment: bytes, gas: int | None = None
    ) -> Receipt:
        """Commits a drawn referee's hidden verdict: `dtrain.commitment_hash(job_id, epoch,
        sender, checkpoint, participation, findings.to_bytes(32, "big"), salt)`. `gas`: send
        without estimation (see `finalize_epoch`)."""
        f = self.contract.functions.commitVerdict(job_id, epoch, _b32(commitment))
        return self._transact(f, gas=gas)

    def reveal_verdict(
        self,
        job_id: int,
        epoch: int,
        checkpoint: bytes,
        participation: Sequence[int],
        findings: int,
        salt: bytes,
        gas: int | None = None,
    ) -> Receipt:
        """Reveals a committed verdict: the (checkpoint, participation) the referee re-executed
        and its findings (`dtrain.findings(consistent, caught)`): the voters whose own
        transcript files lead to their votes, paid whatever the verdict, and the members whose
        replayed packet is not the one they sent, slashed and unpaid."""
        f = self.contract.functions.revealVerdict(
            job_id, epoch, _b32(checkpoint), [int(p) for p in participation], findings, _b32(salt)
        )
        return self._transact(f, gas=gas)

    def resolve_challenge(self, job_id: int, epoch: int, gas: int | None = None) -> Receipt:
        """Ends the challenge (bonds settled, referees off the majority slashed); anyone may."""
        f = self.contract.functions.resolveChallenge(job_id, epoch)
        return self._transact(f, gas=gas)

    def challenge_of(self, attempt: int) -> m.Challenge:
        return m.Challenge.from_struct(self._read("challengeOf", attempt))

    def certified_vote(self, job_id: int) -> tuple[bytes, int]:
        """(vote key a quorum certified for the current attempt, time until which it may be
        challenged); (zero bytes, 0) while reveals are open."""
        r = self._read("certifiedVote", job_id)
        return bytes(r["voteKey"]), int(r["challengeCloses"])

    # ------------------------------------------------------------------ seat draw

    def draw_seats(self, job_id: int, gas: int | None = None) -> Receipt:
        """Seals the seat draw of an `Open` job (its applicants and their weights stand, the
        next block's hash will draw), then, called again once that block is mined, draws the
        seats among its applicants (by capped self-stake) and starts its epoch; anyone may,
        once `seat_draw_at(job_id)` has passed. `gas`: send without estimation."""
        return self._transact(self.contract.functions.drawSeats(job_id), gas=gas)

    def seat_draw_at(self, job_id: int) -> int:
        """When the job's seats are drawn (0: no draw scheduled)."""
        return int(self._read("seatDrawAt", job_id))

    def seat_weight(self, operator: str) -> int:
        """The operator's weight in a seat draw: its self-stake, capped."""
        return int(self._read("seatWeight", operator))

    def cancel_signed_calls(self) -> Receipt:
        """Voids every EIP-712 `OperatorCall` the sender signed and nobody sent yet (its nonce
        `operator_nonce` moves on)."""
        return self._transact(self.contract.functions.cancelSignedCalls())

    # ------------------------------------------------------------------ reads

    def equivocators(self, job_id: int) -> list[str]:
        """Members of the job's current attempt proven to equivocate."""
        mask = self._read("equivocators", job_id)
        members = self.members(job_id)
        return [a for i, a in enumerate(members) if mask >> i & 1]

    def params(self) -> m.Params:
        return m.Params.from_struct(self._read("params"))

    def max_epoch_duration(self) -> int:
        """Longest `epoch_duration` a job may ask for: unbonding_period / 4 - start_grace -
        reveal_window."""
        return int(self._read("maxEpochDuration"))

    def reward_period(self) -> int:
        """Staking reward period (unbonding_period / 2): a deposit made while the operator is in
        a job earns from the start of the second period after it."""
        return int(self._read("rewardPeriod"))

    def operator_nonce(self, operator: str) -> int:
        """Next nonce `operator` signs into an EIP-712 `OperatorCall` sent through the core."""
        return int(self._read("operatorNonce", _addr(operator)))

    def next_job_id(self) -> int:
        return int(self._view("nextJobId"))

    def operator(self, address: str) -> m.Operator:
        a = _addr(address)
        info = self._read("getOperator", a)
        stake, pool, bonded = self.stake_of(a, a), self.pool(a), self.bonded_of(a)
        return m.Operator.from_struct(info, a, self_stake=stake, pool=pool, bonded=bonded)

    def is_attestation_verifier(self, verifier: str) -> bool:
        return bool(self._read("isAttestationVerifier", _addr(verifier)))

    def attestation_of(self, operator: str) -> m.Attestation:
        r = self._read("attestationOf", _addr(operator))
        return m.Attestation(
            verifier=r["verifier"],
            issued_at=r["issuedAt"],
            expires_at=r["expiresAt"],
            tee_type=r["teeType"],
            measurement=bytes(r["measurement"]),
            peer_key=bytes(r["peerKey"]),
            valid=bool(r["valid"]),
        )

    def bonded_of(self, operator: str) -> int:
        """Self-stake `operator` has bonded to its seats (the sum of its jobs' seat bonds): it
        cannot be unstaked (`StakeBonded`) nor bond another seat (`InsufficientFreeStake`)."""
        return int(self._read("bondedOf", _addr(operator)))

    def pool(self, operator: str, block: int | str = "latest") -> m.Pool:
        return m.Pool.from_struct(self._read("getPool", _addr(operator), block=block))

    def stake_of(self, operator: str, account: str, block: int | str = "latest") -> int:
        return int(self._read("stakeOf", _addr(operator), _addr(account), block=block))

    def unbonding_of(
        self, operator: str, account: str, block: int | str = "latest"
    ) -> tuple[int, int]:
        """(amount in wei, unix time it unlocks); (0, 0) when nothing is unbonding."""
        out = self._read("unbondingOf", _addr(operator), _addr(account), block=block)
        return int(out["amount"]), int(out["unlockAt"])

    def positions(self, account: str) -> list[m.Position]:
        """`account`'s stake with each operator it ever staked with, what is unbonding and
        when it unlocks, pending rewards, and what each slash took (see `stakes.positions`)."""
        return stakes.positions(self, _addr(account))

    def earnings(self, operator: str) -> m.Earnings:
        """`operator`'s profit and loss in ether over every job: earned (operator-epochs,
        pool rewards on its own stake, finalizer bounties), slashed from its own stake,
        withdrawn, net."""
        return stakes.earnings(self, _addr(operator))

    def slashes(self, operator: str) -> tuple[m.Slash, ...]:
        """Every slash of `operator`'s pool (its `Slashed` events), oldest first."""
        return stakes.operator_slashes(self, _addr(operator))

    def staked_with(self, account: str) -> list[str]:
        """Operators `account` ever staked with (self-stake included), in the order it first
        did (from the `Staked` events)."""
        return list(stakes.staked_with(self, _addr(account)))

    def final_holders(self, job_id: int) -> list[m.Holder]:
        """Who serves a completed job's final checkpoint: the members paid for its last epoch
        (they voted for it), with their registered peer ids and addresses."""
        return stakes.final_holders(self, job_id)

    def pending_rewards(self, operator: str, account: str) -> int:
        return int(self._view("pendingRewards", _addr(operator), _addr(account)))

    def credit_of(self, account: str) -> int:
        return int(self._view("creditOf", _addr(account)))

    def balances(self, account: str, operators: Iterable[str] = ()) -> m.Balances:
        a = _addr(account)
        return m.Balances(
            address=a,
            wallet=self.w3.eth.get_balance(a),
            credit=self.credit_of(a),
            pending_rewards={_addr(o): self.pending_rewards(o, a) for o in operators},
        )

    def job(self, job_id: int, block: int | None = None) -> m.Job:
        """A consistent snapshot: every read at one block (the latest, or `block`), so state
        and members cannot come from the two sides of an epoch boundary."""
        at = self.w3.eth.block_number if block is None else block
        names = ("getJob", "voteCounts", "getMembers", "getPendingJoins", "epochDeadline")
        got, votes, members, joins, deadline, reveal = self._reads(
            [(n, (job_id,)) for n in (*names, "revealDeadline")], block=at
        )
        state = m.JobState.from_struct(got["state"])
        if state.status == m.JobStatus.NONE:
            raise CONTRACT_ERRORS["UnknownJob"](job_id)
        return m.Job(
            id=job_id,
            spec=m.JobSpec.from_struct(got["spec"]),
            state=state,
            members=tuple(members),
            pending_joins=tuple(joins),
            committed=int(votes["committed"]),
            revealed=int(votes["revealed"]),
            deadline=int(deadline),
            reveal_deadline=int(reveal),
            block=at,
        )

    def vote_counts(self, job_id: int, block: int | str = "latest") -> tuple[int, int]:
        """(committed, revealed): members that committed and revealed in the epoch in progress."""
        out = self._read("voteCounts", job_id, block=block)
        return int(out["committed"]), int(out["revealed"])

    def reveal_deadline(self, job_id: int, block: int | str = "latest") -> int:
        """Unix time until which reveals are accepted: the epoch's deadline + reveal_window
        (0 when no epoch is running)."""
        return int(self._read("revealDeadline", job_id, block=block))

    def latest_block_timestamp(self) -> int:
        """Unix time of the latest block. A chain that mines only on transactions (anvil)
        lags the wall clock until the next transaction."""
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def jobs(self) -> list[m.Job]:
        return [self.job(i) for i in range(1, self.next_job_id())]

    def members(self, job_id: int, block: int | str = "latest") -> list[str]:
        """The members of the epoch in progress at `block` (none once the job ended)."""
        return list(self._view("getMembers", job_id, block=block))

    def is_leaving(self, job_id: int, operator: str) -> bool:
        return bool(self._view("isLeaving", job_id, _addr(operator)))

    def epoch_checkpoint(self, job_id: int, epoch: int) -> bytes:
        return bytes(self._view("epochCheckpoint", job_id, epoch))

    def submission_of(
        self, job_id: int, operator: str, block: int | str = "latest"
    ) -> m.Submission:
        """`operator`'s commitment and revealed vote in the epoch in progress."""
        return m.Submission.from_struct(
            self._read("submissionOf", job_id, _addr(operator), block=block)
        )

    def accounting(self) -> m.Accounting:
        return m.Accounting.from_struct(self._read("accounting"))

    def contract_balance(self) -> int:
        return self.w3.eth.get_balance(self.address)

    # ------------------------------------------------------------------ events

    def events(
        self,
        from_block: int = 0,
        to_block: int | str = "latest",
        names: Iterable[str] | None = None,
        job_id: int | None = None,
    ) -> list[m.Event]:
        """Decoded contract events in block order, optionally of one job."""
        logs = self.w3.eth.get_logs(
            {"address": self.address, "fromBlock": from_block, "toBlock": to_block}
        )
        wanted = set(names) if names is not None else None
        out = []
        for e in self._decode_logs(logs):
            if wanted is not None and e.name not in wanted:
                continue
            if job_id is not None and e.args.get("jobId") != job_id:
                continue
            out.append(e)
        return out

    def watch(
        self,
        from_block: int | None = None,
        names: Iterable[str] | None = JOB_EVENTS,
        job_id: int | None = None,
        poll_interval: float = 0.5,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[m.Event]:
        """Yields events as blocks arrive (polling), from `from_block` (default: next block)."""
        wanted = list(names) if names is not None else None
        next_block = self.w3.eth.block_number + 1 if from_block is None else from_block
        while not (stop and stop()):
            head = self.w3.eth.block_number
            if head >= next_block:
                yield from self.events(next_block, head, wanted, job_id)
                next_block = head + 1
            else:
                time.sleep(poll_interval)


def _named(param: dict[str, Any], value: Any) -> Any:
    """A decoded ABI value with each struct (also inside arrays) as a dict by component name."""
    kind = param["type"]
    if kind.endswith("]"):
        inner = {**param, "type": kind[: kind.rindex("[")]}
        return [_named(inner, v) for v in value]
    if kind == "tuple":
        return {c["name"]: _named(c, v) for c, v in zip(param["components"], value, strict=True)}
    return value


def _b32(value: bytes | str) -> bytes:
    raw = bytes.fromhex(value.removeprefix("0x")) if isinstance(value, str) else bytes(value)
    if len(raw) != 32:
        raise ConfigError(f"expected 32 bytes, got {len(raw)}")
    return raw


def _unit(token: str | None) -> str:
    """A payment unit as the contract names it: address(0) for ether."""
    return _addr(token) if token is not None else "0x" + "00" * 20


def _addr(value: str) -> str:
    if not Web3.is_address(value):
        raise ConfigError(f"{value!r} is not an address")
    return Web3.to_checksum_address(value)


class CompanionContract:
    """A contract the SDK deploys next to the BSM (a token, a verifier), optionally with a
    signing account; its transactions go through the BSM client's path: the same nonce
    bookkeeping, gas estimation and error handling. Subclasses name their `abi()` and
    `bytecode()` (from a shipped artifact)."""

    _send = BSM._send
    _rpc_error = BSM._rpc_error
    _revert_error = BSM._revert_error
    _transact = BSM._transact
    sender = BSM.sender

    def __init__(self, w3: Web3, address: str, account: LocalAccount | None = None) -> None:
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.account = account
        self.chain_id = w3.eth.chain_id
        self.receipt_timeout = 120.0
        self.contract = w3.eth.contract(address=self.address, abi=self.abi())

    @classmethod
    def abi(cls) -> list[dict[str, Any]]:
        raise NotImplementedError

    @classmethod
    def bytecode(cls) -> str:
        raise NotImplementedError

    @classmethod
    def _deploy(
        cls, rpc_url_or_w3: str | Web3, key: str | LocalAccount, *args: Any
    ) -> CompanionContract:
        """Deploys the contract with constructor `args`, signed by `key`."""
        w3 = connect(rpc_url_or_w3) if isinstance(rpc_url_or_w3, str) else rpc_url_or_w3
        account = load_key(key) if isinstance(key, str) else key
        deployer = cls.__new__(cls)
        deployer.w3, deployer.account, deployer.receipt_timeout = w3, account, 120.0
        deployer.chain_id = w3.eth.chain_id
        deployer.contract = w3.eth.contract(abi=cls.abi(), bytecode=cls.bytecode())
        rc = deployer._send(deployer.contract.constructor(*args))
        return cls(w3, rc["contractAddress"], account)

    def with_account(self, key: str | LocalAccount) -> Self:
        return type(self)(self.w3, self.address, load_key(key) if isinstance(key, str) else key)

    def _decode_logs(self, logs: Any) -> list[Any]:
        return []  # receipts of these contracts carry no BSM events
