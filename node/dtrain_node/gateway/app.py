"""The job gateway's HTTP API: training jobs bought over x402.

`GET /` says what it sells (token, payee, network, contract). `POST /jobs` with a job spec
(`dtrain.paidjobs.spec_to_json`'s shape): a spec the contract would refuse is answered 400
before any money moves; without a payment, 402 with the x402 requirements for the job's escrow
in the token, paid to the gateway; with a valid payment, the gateway settles it to itself,
approves the BSM and calls `createJobWithToken(spec, token, payer)`, and answers 201 with the
job id, the settlement and the creation transactions. If creating the job fails after the
payment settled, the payment is sent back to the payer (502, with the refund transaction)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, replace
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response
from web3 import Web3
from web3.exceptions import (
    ContractCustomError,
    ContractLogicError,
    ContractPanicError,
    MismatchedABI,
    Web3ValidationError,
)

from dtrain.client import BSM, NONCES
from dtrain.devtoken import TestUSD
from dtrain.errors import ContractError, DtrainError, decode_revert
from dtrain.models import JobSpec, snake_case
from dtrain.paidjobs import SpecError, spec_from_json
from dtrain.x402 import PaymentRefused, Paywall, Settled, payment_header

log = logging.getLogger("dtrain.gateway")

# The contract's refusals of a spec (or of the token) in createJobWithToken's checks: a 400.
SPEC_ERRORS = frozenset(
    {
        "InvalidOperatorRange",
        "InvalidSchedule",
        "InvalidCompression",
        "InvalidEpochDuration",
        "ZeroValue",
        "SeatBondTooLow",
        "TokenNotAllowed",
        "ZeroOwner",
    }
)
MAX_BODY = 64 * 1024


@dataclass(frozen=True)
class Refused(Exception):
    status: int
    code: str
    message: str

    def response(self) -> JSONResponse:
        return error(self.status, self.code, self.message)


def error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": code}, **extra}, status)


class Gateway:
    """Sells jobs of one BSM, escrowed in one token, as the `bsm` account (the payee)."""

    def __init__(self, bsm: BSM, paywall: Paywall) -> None:
        if bsm.account is None:
            raise DtrainError("the gateway needs a signing account (--key)")
        self.bsm, self.paywall = bsm, paywall
        self.token = TestUSD(bsm.w3, paywall.token.address, bsm.account)  # any ERC-20 call
        self.address = bsm.sender
        self._lock = asyncio.Lock()  # one settlement + creation at a time: one nonce sequence

    def terms(self) -> dict[str, Any]:
        t = self.paywall.token
        return {
            "contract": self.bsm.address,
            "chainId": self.bsm.chain_id,
            "network": self.paywall.network,
            "token": t.address,
            "tokenName": t.name,
            "decimals": t.decimals,
            "payTo": self.paywall.pay_to,
            "facilitator": self.paywall.facilitator.address,
        }

    async def buy(self, request: Request) -> Response:
        try:
            spec = self.parse(await request.body())
            await asyncio.to_thread(self.check, spec, self.address)
        except Refused as refused:
            return refused.response()
        req = self.paywall.requirements(spec.escrow)
        try:
            verified = await self.paywall.verify(payment_header(request.headers), req)
        except PaymentRefused as refused:
            return self._payment_required(request, req, spec, refused)
        async with self._lock:
            try:
                settled = await self.paywall.settle(verified)
            except PaymentRefused as refused:
                return self._payment_required(request, req, spec, refused)
            log.info(
                "paid %s by %s: %s",
                self.paywall.token.show(spec.escrow),
                settled.payer,
                settled.transaction,
            )
            try:
                job_id, create_tx = await asyncio.to_thread(self.create, spec, settled.payer)
            except DtrainError as exc:
                return await self._refund(settled, exc)
        log.info("job %d created for %s: %s", job_id, settled.payer, create_tx)
        body = {
            "jobId": job_id,
            "escrow": str(spec.escrow),
            "token": self.paywall.token.address,
            "payer": settled.payer,
            "settlementTx": settled.transaction,
            "createTx": create_tx,
        }
        return JSONResponse(body, 201, {"PAYMENT-RESPONSE": settled.header})

    def parse(self, raw: bytes) -> JobSpec:
        if len(raw) > MAX_BODY:
            raise Refused(413, "body_too_large", f"the job spec is over {MAX_BODY} bytes")
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise Refused(400, "invalid_json", f"the request body is not JSON: {exc}") from None
        try:
            spec = spec_from_json(data)
        except SpecError as exc:
            raise Refused(400, "invalid_job_spec", str(exc)) from None
        if spec.seat_bond == 0:
            spec = replace(spec, seat_bond=self.bsm.params().min_seat_bond)
        return spec

    def check(self, spec: JobSpec, owner: str) -> None:
        """Refused(400) when the contract would refuse the spec: createJobWithToken simulated;
        its escrow transfer (which comes after every check of the spec) may fail here."""
        try:
            fn = self.bsm.contract.functions.createJobWithToken(
                spec.as_tuple(), self.paywall.token.address, Web3.to_checksum_address(owner)
            )
            fn.call({"from": self.address})
        except (ContractCustomError, ContractLogicError, ContractPanicError) as exc:
            data = getattr(exc, "data", None)
            problem = decode_revert(data if isinstance(data, str) else None)
            if isinstance(problem, ContractError) and problem.error_name in SPEC_ERRORS:
                raise Refused(
                    400, problem.error_name, f"the contract refuses this job: {problem}"
                ) from None
        except (MismatchedABI, Web3ValidationError, ValueError, TypeError, OverflowError):
            raise Refused(400, "invalid_job_spec", self._too_large(spec)) from None

    def _too_large(self, spec: JobSpec) -> str:
        """Which field does not fit its type in the contract's JobSpec (e.g. a uint32)."""
        fn = self.bsm.contract.get_function_by_name("createJobWithToken")
        for part in fn.abi["inputs"][0]["components"]:
            bits = part["type"].removeprefix("uint")
            name = snake_case(part["name"])
            value = getattr(spec, name, None)
            if bits.isdigit() and isinstance(value, int) and value >= 2 ** int(bits):
                return f"{name}: {value} does not fit the contract's {part['type']}"
        return "the job spec does not fit the contract's JobSpec"

    def create(self, spec: JobSpec, owner: str) -> tuple[int, str]:
        """Approve the BSM for the escrow (when needed), then createJobWithToken for `owner`."""
        NONCES.forget()  # the facilitator may have sent from this account meanwhile
        bsm_address = self.bsm.address
        if self.token.allowance(self.address, bsm_address) < spec.escrow:
            self.token.approve(bsm_address, spec.escrow)
        fn = self.bsm.contract.functions.createJobWithToken(
            spec.as_tuple(), self.paywall.token.address, Web3.to_checksum_address(owner)
        )
        rc = self.bsm._transact(fn)
        return int(rc.first("JobCreated").args["jobId"]), rc.tx_hash

    async def _refund(self, settled: Settled, exc: DtrainError) -> Response:
        log.warning("job creation failed after %s paid: %s; refunding", settled.payer, exc)
        try:
            rc = await asyncio.to_thread(self._send_back, settled)
        except DtrainError as refund_exc:
            log.error("refund to %s failed: %s", settled.payer, refund_exc)
            return error(
                500,
                "refund_failed",
                f"job creation failed ({exc}) and the refund of the payment failed "
                f"({refund_exc}): contact the gateway",
                settlementTx=settled.transaction,
            )
        return error(
            502,
            "job_creation_failed",
            f"job creation failed ({exc}); the payment was refunded",
            settlementTx=settled.transaction,
            refundTx=rc,
        )

    def _send_back(self, settled: Settled) -> str:
        NONCES.forget()
        return self.token.transfer(settled.payer, settled.amount).tx_hash

    def _payment_required(
        self, request: Request, req: Any, spec: JobSpec, refused: PaymentRefused
    ) -> Response:
        headers, required = self.paywall.payment_required(
            req,
            str(request.url),
            f"a training job escrowing {self.paywall.token.show(spec.escrow)}",
            refused.reason,
        )
        message = (
            f"payment required: the job's escrow, {self.paywall.token.show(spec.escrow)}, over x402"
            if refused.reason == "payment_required"
            else str(refused)
        )
        body = {"error": {"message": message, "code": refused.reason}}
        body.update({k: v for k, v in required.items() if k != "error"})
        return JSONResponse(body, 402, headers)


def create_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="dtrain gateway", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/")
    async def terms() -> dict[str, Any]:
        return gateway.terms()

    @app.post("/jobs")
    async def jobs(request: Request) -> Response:
        return await gateway.buy(request)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s", request.url.path)
        return error(500, "server_error", f"internal error: {exc}")

    return app
