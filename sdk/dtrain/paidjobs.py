"""Jobs bought over x402 from a `dtrain gateway`: the job spec as JSON (what `POST /jobs`
takes), and the caller's side, which pays the gateway's 402 for the job's escrow and gets the
job id back. The job is created for the payer: it owns it (cancels it, receives its refunds)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from eth_account.signers.local import LocalAccount

from .errors import DtrainError
from .models import JobSpec, Method
from .x402 import PaymentRefused, paying_http_client_sync, settlement_of

HASH_FIELDS = ("model_hash", "dataset_hash", "recipe_hash")
TEXT_FIELDS = ("model_uri", "dataset_uri", "recipe_uri")
MAX_TEXT = 2048  # characters of a URI field


class SpecError(DtrainError):
    """A job spec that is not one: unknown or missing fields, wrong types, bad hashes."""


class GatewayError(DtrainError):
    """The gateway answered with an error (its message is in this one)."""


def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    """The spec as JSON: JobSpec's field names, hashes as 0x-hex, the method by name."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if isinstance(value, bytes):
            value = "0x" + value.hex()
        elif isinstance(value, Method):
            value = value.name.lower()
        out[f.name] = value
    return out


def spec_from_json(data: Any) -> JobSpec:
    """A JobSpec from `spec_to_json`'s shape, checked field by field (`SpecError`)."""
    if not isinstance(data, dict):
        raise SpecError("the job spec must be a JSON object")
    known = {f.name: f for f in dataclasses.fields(JobSpec)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise SpecError(f"unknown job spec field(s): {', '.join(unknown)}")
    if "price_per_operator_epoch" not in data:
        raise SpecError("price_per_operator_epoch is required")
    values = {name: _field(name, value) for name, value in data.items()}
    return JobSpec(**values)


def _field(name: str, value: Any) -> Any:
    if name == "method":
        if isinstance(value, str) and value.upper() in Method.__members__:
            return Method[value.upper()]
        if isinstance(value, int) and not isinstance(value, bool) and value in set(Method):
            return Method(value)
        raise SpecError(
            f"method: {value!r} is not one of {', '.join(m.name.lower() for m in Method)}"
        )
    if name in HASH_FIELDS:
        text = value.removeprefix("0x") if isinstance(value, str) else ""
        if len(text) != 64 or any(c not in "0123456789abcdefABCDEF" for c in text):
            raise SpecError(f"{name}: must be 32 bytes as 0x-hex, got {value!r}")
        return bytes.fromhex(text)
    if name in TEXT_FIELDS:
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise SpecError(f"{name}: must be a string of at most {MAX_TEXT} characters")
        return value
    if name == "tee_required":
        if not isinstance(value, bool):
            raise SpecError(f"{name}: must be true or false")
        return value
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**256:
        raise SpecError(f"{name}: must be a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Purchase:
    """A job bought from a gateway."""

    job_id: int
    escrow: int  # in the token's base units
    token: str
    payer: str  # the job's owner
    settlement_tx: str  # the payment to the gateway
    create_tx: str  # the gateway's createJobWithToken


def gateway_terms(url: str, timeout: float = 30.0) -> dict[str, Any]:
    """What a gateway sells: `GET /` (token, its name and decimals, payee, network, contract)."""
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + "/", timeout=timeout)
    except httpx.HTTPError as exc:
        raise GatewayError(f"gateway {url} unreachable: {type(exc).__name__}") from None
    if r.status_code != 200:
        raise GatewayError(f"gateway {url} answered {r.status_code} to GET /")
    return r.json()


def buy_job(
    url: str,
    spec: JobSpec,
    account: LocalAccount,
    max_amount: int,
    asset: str | None = None,
    timeout: float = 120.0,
) -> Purchase:
    """POST `spec` to the gateway at `url`, paying its 402 from `account` (at most
    `max_amount` base units, only in `asset` when given); the job it created for `account`."""
    import httpx

    with paying_http_client_sync(account, max_amount, asset, timeout=timeout) as http:
        try:
            r = http.post(url.rstrip("/") + "/jobs", json=spec_to_json(spec))
        except httpx.HTTPError as exc:
            raise GatewayError(f"gateway {url} unreachable: {type(exc).__name__}") from None
    body = _json(r)
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    if r.status_code == 402:
        raise PaymentRefused(
            str(error.get("code", "payment_required")), str(error.get("message", ""))
        )
    if r.status_code != 201:
        raise GatewayError(
            f"gateway refused the job ({r.status_code}): {error.get('message', r.text[:300])}"
        )
    settlement = settlement_of(r) or {}
    return Purchase(
        job_id=int(body["jobId"]),
        escrow=int(body["escrow"]),
        token=str(body["token"]),
        payer=str(body["payer"]),
        settlement_tx=str(body.get("settlementTx") or settlement.get("transaction", "")),
        create_tx=str(body["createTx"]),
    )


def _json(r: Any) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
