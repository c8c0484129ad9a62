"""x402 payments in the `exact` EVM scheme (an EIP-3009 `transferWithAuthorization` signed by
the payer), thin over the official `x402` package.

- `LocalFacilitator`: verifies and settles payments on a chain we reach by RPC, with a funded
  key that submits the authorizations (and pays their gas). No third-party facilitator.
- `Paywall`: the resource server's side: the payment requirements for an amount of a token to a
  payee, then verify a payment header against them, then settle it. A payment is claimed
  (payer, nonce) when verified, so the same authorization cannot pay two calls in flight.
- `paying_http_client` / `paying_http_client_sync`: httpx clients that answer a 402 by paying
  it, up to a per-call cap in one token (what `openai.OpenAI(http_client=...)` takes).

The 402 carries the requirements base64-encoded in the `PAYMENT-REQUIRED` header (x402 v2); the
payment comes back in `PAYMENT-SIGNATURE` (`X-PAYMENT` is read too), the settlement in
`PAYMENT-RESPONSE`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from pathlib import Path
from typing import Any

import httpx
from eth_account.signers.local import LocalAccount
from web3 import Web3
from x402 import x402Client, x402ClientSync, x402FacilitatorSync, x402ResourceServer
from x402.client import max_amount as max_amount_policy
from x402.http import x402HTTPClientSync
from x402.http.clients.httpx import x402AsyncTransport
from x402.http.utils import (
    decode_payment_signature_header,
    encode_payment_required_header,
    encode_payment_response_header,
)
from x402.mechanisms.evm import FacilitatorWeb3Signer
from x402.mechanisms.evm.exact import (
    register_exact_evm_client,
    register_exact_evm_facilitator,
    register_exact_evm_server,
)
from x402.schemas import (
    AssetAmount,
    PaymentPayload,
    PaymentRequired,
    PaymentRequirements,
    ResourceConfig,
    ResourceInfo,
)

from .errors import ConfigError, DtrainError, InvalidAmount

MULTICALL3 = "0xcA11bde05977b3631167028862bE2a173976CA11"  # where x402 batches its reads
PAYMENT_HEADERS = ("payment-signature", "x-payment")
REQUIRED_HEADER, RESPONSE_HEADER = "PAYMENT-REQUIRED", "PAYMENT-RESPONSE"
DEFAULT_TIMEOUT_S = 300  # how long a signed authorization stays valid
_MULTICALL_ARTIFACT = Path(__file__).resolve().parent / "artifacts" / "DevMulticall.json"
_EIP712_DOMAIN_ABI = [
    {
        "type": "function",
        "name": "eip712Domain",
        "stateMutability": "view",
        "inputs": [],
        "outputs": [
            {"name": "fields", "type": "bytes1"},
            {"name": "name", "type": "string"},
            {"name": "version", "type": "string"},
            {"name": "chainId", "type": "uint256"},
            {"name": "verifyingContract", "type": "address"},
            {"name": "salt", "type": "bytes32"},
            {"name": "extensions", "type": "uint256[]"},
        ],
    },
    {
        "type": "function",
        "name": "decimals",
        "stateMutability": "view",
        "inputs": [],
        "outputs": [{"name": "", "type": "uint8"}],
    },
]


class PaymentRefused(DtrainError):
    """A payment that does not pay: `reason` is x402's code (e.g. `invalid_signature`)."""

    def __init__(self, reason: str, message: str = "") -> None:
        self.reason, self.detail = reason, message
        super().__init__(f"payment refused: {reason}" + (f" ({message})" if message else ""))


def network_of(chain_id: int) -> str:
    """The CAIP-2 name x402 uses for an EVM chain."""
    return f"eip155:{chain_id}"


@cache
def _multicall_code() -> str:
    return json.loads(_MULTICALL_ARTIFACT.read_text())["deployedBytecode"]


def install_multicall(w3: Web3) -> bool:
    """Put DevMulticall's runtime code at Multicall3's address on a local anvil chain, where
    nothing is deployed there (x402's facilitator batches its diagnostic reads through it).
    True when it installed it; a chain that has no `anvil_setCode` is left as it is."""
    if len(w3.eth.get_code(Web3.to_checksum_address(MULTICALL3))) > 0:
        return False
    answer = w3.provider.make_request("anvil_setCode", [MULTICALL3, _multicall_code()])
    return "error" not in answer


@dataclass(frozen=True)
class Token:
    """An EIP-3009 token as x402 needs it: its address and EIP-712 domain name and version."""

    address: str
    name: str
    version: str
    decimals: int

    @classmethod
    def read(cls, w3: Web3, address: str) -> Token:
        """Read from the chain (ERC-5267 `eip712Domain()` and `decimals()`)."""
        if not Web3.is_address(address):
            raise ConfigError(f"token: {address!r} is not an address")
        checksum = Web3.to_checksum_address(address)
        contract = w3.eth.contract(address=checksum, abi=_EIP712_DOMAIN_ABI)
        try:
            domain = contract.functions.eip712Domain().call()
            decimals = int(contract.functions.decimals().call())
        except Exception:
            raise ConfigError(
                f"token {checksum} does not answer eip712Domain() and decimals(): "
                "not an EIP-3009 token on this chain"
            ) from None
        return cls(checksum, str(domain[1]), str(domain[2]), decimals)

    def units(self, amount: str | int | Decimal) -> int:
        """`amount` whole tokens (e.g. "0.05") in base units; exact or refused."""
        try:
            value = Decimal(str(amount).strip())
        except InvalidOperation:
            raise InvalidAmount(f"cannot read amount {amount!r}") from None
        base = value * (10**self.decimals)
        if not value.is_finite() or value < 0 or base != base.to_integral_value():
            raise InvalidAmount(
                f"amount {amount!r} is not a non-negative multiple of 10^-{self.decimals}"
            )
        return int(base)

    def show(self, base_units: int) -> str:
        return f"{Decimal(base_units) / (10**self.decimals):f} {self.name}"


class LocalFacilitator:
    """The x402 facilitator run in this process: checks `exact` EVM payments against the chain
    (signature, payee, amount, validity window, the payer's balance, an unused nonce, by
    simulating the transfer) and settles them by submitting `transferWithAuthorization` from
    `key`'s account. Serves as the resource server's facilitator client."""

    def __init__(self, rpc_url: str, key: str, receipt_timeout_s: float = 60.0) -> None:
        self.signer = FacilitatorWeb3Signer(
            private_key=key, rpc_url=rpc_url, confirmation_timeout_seconds=receipt_timeout_s
        )
        self.network = network_of(self.signer.get_chain_id())
        self._facilitator = x402FacilitatorSync()
        register_exact_evm_facilitator(self._facilitator, self.signer, networks=self.network)

    @property
    def address(self) -> str:
        return self.signer.address

    async def verify(self, payload: Any, requirements: Any) -> Any:
        return await asyncio.to_thread(self._facilitator.verify, payload, requirements)

    async def settle(self, payload: Any, requirements: Any) -> Any:
        return await asyncio.to_thread(self._facilitator.settle, payload, requirements)

    def get_supported(self) -> Any:
        return self._facilitator.get_supported()


@dataclass(frozen=True)
class Verified:
    """A payment that passed verification, claimed for one call until settled or released."""

    payload: PaymentPayload
    requirements: PaymentRequirements
    payer: str
    claim: tuple[str, str]  # (payer, nonce), lower-case


@dataclass(frozen=True)
class Settled:
    transaction: str
    payer: str
    amount: int
    header: str  # the PAYMENT-RESPONSE header value


class Paywall:
    """The payee's side of x402 for one token and one payee: requirements, then verify, then
    settle, each through the official resource server and the facilitator it was given."""

    def __init__(
        self,
        facilitator: LocalFacilitator,
        token: Token,
        pay_to: str,
        timeout_s: int = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not Web3.is_address(pay_to):
            raise ConfigError(f"pay-to: {pay_to!r} is not an address")
        self.facilitator, self.token = facilitator, token
        self.pay_to = Web3.to_checksum_address(pay_to)
        self.network, self.timeout_s = facilitator.network, timeout_s
        self.server = x402ResourceServer(facilitator)
        register_exact_evm_server(self.server, networks=self.network)
        self.server.initialize()
        self._claims: dict[tuple[str, str], int] = {}  # -> validBefore: forgotten after it
        self._lock = threading.Lock()

    def requirements(self, amount: int) -> PaymentRequirements:
        """Pay exactly `amount` base units of the token to the payee."""
        price = AssetAmount(
            amount=str(amount),
            asset=self.token.address,
            extra={"name": self.token.name, "version": self.token.version},
        )
        config = ResourceConfig(
            scheme="exact",
            pay_to=self.pay_to,
            price=price,
            network=self.network,
            max_timeout_seconds=self.timeout_s,
        )
        [req] = self.server.build_payment_requirements(config)
        return req

    def payment_required(
        self, req: PaymentRequirements, url: str, description: str, error: str | None = None
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """(headers, JSON body) of a 402 asking for `req`."""
        required = PaymentRequired(
            accepts=[req], resource=ResourceInfo(url=url, description=description), error=error
        )
        body = required.model_dump(by_alias=True, exclude_none=True, mode="json")
        return {REQUIRED_HEADER: encode_payment_required_header(required)}, body

    async def verify(self, header: str | None, req: PaymentRequirements) -> Verified:
        """The payment in `header`, verified against `req` and claimed; or `PaymentRefused`."""
        if not header:
            raise PaymentRefused("payment_required", "no PAYMENT-SIGNATURE (or X-PAYMENT) header")
        try:
            payload = decode_payment_signature_header(header)
        except Exception:
            raise PaymentRefused("invalid_payload", "the payment header is not x402") from None
        if not isinstance(payload, PaymentPayload) or payload.x402_version != 2:
            raise PaymentRefused("invalid_x402_version", "only x402 version 2 is accepted")
        auth = payload.payload.get("authorization")
        if not isinstance(auth, dict) or not {"from", "nonce"} <= auth.keys():
            raise PaymentRefused("invalid_payload", "not an EIP-3009 authorization")
        if self.server.find_matching_requirements([req], payload) is None:
            raise PaymentRefused(
                "payment_mismatch",
                f"this call costs {self.token.show(int(req.amount))} ({req.amount} base units of "
                f"{req.asset}) paid to {req.pay_to} on {req.network}",
            )
        claim = (str(auth["from"]).lower(), str(auth["nonce"]).lower())
        try:
            valid_before = int(auth.get("validBefore", 0))
        except (TypeError, ValueError):
            raise PaymentRefused("invalid_payload", "validBefore is not a number") from None
        with self._lock:
            now = int(time.time())  # an expired authorization never verifies: no claim needed
            for old in [c for c, until in self._claims.items() if until < now]:
                del self._claims[old]
            if claim in self._claims:
                raise PaymentRefused("payment_already_used", "this authorization was used")
            self._claims[claim] = valid_before
        try:
            result = await self.server.verify_payment(payload, req)
        except Exception as exc:
            self.release_claim(claim)
            raise PaymentRefused("verification_failed", str(exc)) from None
        if not result.is_valid:
            self.release_claim(claim)
            raise PaymentRefused(result.invalid_reason or "invalid_payment", "")
        return Verified(payload, req, Web3.to_checksum_address(str(auth["from"])), claim)

    async def settle(self, verified: Verified) -> Settled:
        """Move the money (the facilitator submits the authorization); or `PaymentRefused`.
        The claim stays: a settled authorization is spent, a failed one was tried."""
        result = await self.server.settle_payment(verified.payload, verified.requirements)
        if not result.success:
            raise PaymentRefused(result.error_reason or "settlement_failed", "")
        return Settled(
            transaction=result.transaction,
            payer=verified.payer,
            amount=int(verified.requirements.amount),
            header=encode_payment_response_header(result),
        )

    def release_claim(self, claim: tuple[str, str]) -> None:
        """The call was not served and not settled: the authorization may pay another call."""
        with self._lock:
            self._claims.pop(claim, None)


def payment_header(headers: Any) -> str | None:
    """The x402 payment in a request's headers (`PAYMENT-SIGNATURE`, else `X-PAYMENT`)."""
    for name in PAYMENT_HEADERS:
        value = headers.get(name)
        if value:
            return str(value)
    return None


# ---------------------------------------------------------------------------- the payer's side


def _controls(max_amount: int, asset: str | None) -> dict[str, Any]:
    if asset is None:
        return {"allowed_assets": True, "max_amount_per_payment": False}
    entry = {"network": "eip155:*", "asset": asset, "max_amount_per_payment": str(max_amount)}
    return {"allowed_assets": [entry]}


def _payer(client: Any, account: LocalAccount, max_amount: int, asset: str | None) -> Any:
    if max_amount < 0:
        raise InvalidAmount("the per-call cap must be >= 0")
    register_exact_evm_client(client, account)
    client.set_spend_controls(_controls(max_amount, asset))
    client.register_policy(max_amount_policy(max_amount))  # every asset: never above the cap
    return client


def paying_http_client(
    account: LocalAccount, max_amount: int, asset: str | None = None, **kwargs: Any
) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` that pays each 402 from `account` (`exact` EVM scheme), at most
    `max_amount` base units a call, only in `asset` when given; a 402 asking for more is
    not paid. For `openai.AsyncOpenAI(http_client=...)`."""
    client = _payer(x402Client(), account, max_amount, asset)
    return httpx.AsyncClient(transport=x402AsyncTransport(client), **kwargs)


class PayingTransport(httpx.BaseTransport):
    """The sync twin of x402's httpx transport: a 402 is paid once and the request retried."""

    def __init__(self, client: x402ClientSync, inner: httpx.BaseTransport | None = None) -> None:
        self.http = x402HTTPClientSync(client)
        self.inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        response = self.inner.handle_request(request)
        if response.status_code != 402:
            return response
        body = response.read()
        try:
            headers, _ = self.http.handle_402_response(
                dict(response.headers), body, str(request.url)
            )
        except Exception as exc:
            raise PaymentRefused("payment_not_made", str(exc)) from None
        response.close()
        retry = httpx.Request(
            request.method,
            request.url,
            headers={**dict(request.headers), **headers},
            content=request.content,
            extensions=request.extensions,
        )
        return self.inner.handle_request(retry)

    def close(self) -> None:
        self.inner.close()


def paying_http_client_sync(
    account: LocalAccount, max_amount: int, asset: str | None = None, **kwargs: Any
) -> httpx.Client:
    """`paying_http_client` for sync code (`openai.OpenAI(http_client=...)`, the CLI)."""
    client = _payer(x402ClientSync(), account, max_amount, asset)
    return httpx.Client(transport=PayingTransport(client), **kwargs)


def settlement_of(response: httpx.Response) -> dict[str, Any] | None:
    """The settlement a paid response carries (transaction, payer, network, ...), if any."""
    from x402.http.utils import decode_payment_response_header

    value = response.headers.get(RESPONSE_HEADER) or response.headers.get("x-payment-response")
    if not value:
        return None
    return decode_payment_response_header(value).model_dump(by_alias=True, mode="json")
