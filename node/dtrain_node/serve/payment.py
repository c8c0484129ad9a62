"""The paying seam: the app asks a `Payment` before every generating call.

`Free` lets every call through. `X402` charges a price per call over x402: `admit` reads the
request's payment header and answers with a `refusal` (HTTP 402 and its payment requirements)
or an admission (with response headers when it settled already); `settle` runs once the call
is done, with the tokens it used, and answers with the settlement receipt's headers or a
`Response` to send instead of the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dtrain.x402 import RESPONSE_HEADER, PaymentRefused, Paywall, payment_header

log = logging.getLogger("dtrain.serve")


@dataclass(frozen=True)
class Call:
    """What a request asks for, known before generating (what a price is quoted on)."""

    endpoint: str  # "completions" | "chat.completions"
    model: str
    prompt_tokens: int
    max_tokens: int  # the most it may generate
    stream: bool


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


@dataclass(frozen=True)
class Admission:
    """`refusal` set: sent instead of generating. Else `headers` go on the response."""

    refusal: Response | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


class Payment(Protocol):
    async def admit(self, request: Request, call: Call) -> Admission: ...

    async def settle(
        self, request: Request, call: Call, usage: Usage
    ) -> Mapping[str, str] | Response | None:
        """After the call ran: headers for its response, or a `Response` sent instead."""


class Free:
    """Every call admitted, nothing to settle: `dtrain serve` without a price."""

    async def admit(self, request: Request, call: Call) -> Admission:
        return Admission()

    async def settle(self, request: Request, call: Call, usage: Usage) -> None:
        return None


class X402:
    """Each generating call costs `price` base units of the paywall's token, paid over x402
    (`exact` EVM scheme): a call without a valid payment is answered 402 with the payment
    requirements; a paid call is verified before generating and settled after (a streamed
    call: settled before its first byte, since its answer cannot be withheld). A payment
    that fails to settle withholds the answer (402)."""

    def __init__(self, paywall: Paywall, price: int, description: str) -> None:
        self.paywall, self.price, self.description = paywall, price, description
        self.requirements = paywall.requirements(price)

    def terms(self) -> dict[str, object]:
        """The price as the listening line's JSON reports it."""
        return {
            "amount": self.price,
            "token": self.paywall.token.address,
            "pay_to": self.paywall.pay_to,
            "network": self.paywall.network,
            "facilitator": self.paywall.facilitator.address,
        }

    def note(self) -> str:
        return (
            f"each call costs {self.paywall.token.show(self.price)} paid over x402 to "
            f"{self.paywall.pay_to}"
        )

    async def admit(self, request: Request, call: Call) -> Admission:
        try:
            verified = await self.paywall.verify(payment_header(request.headers), self.requirements)
        except PaymentRefused as refused:
            return Admission(refusal=self._refusal(request, refused))
        if not call.stream:
            request.state.x402 = verified
            return Admission()
        try:
            settled = await self.paywall.settle(verified)
        except PaymentRefused as refused:
            return Admission(refusal=self._refusal(request, refused))
        log.info(
            "paid %s by %s: %s",
            self.paywall.token.show(self.price),
            settled.payer,
            settled.transaction,
        )
        return Admission(headers={RESPONSE_HEADER: settled.header})

    async def settle(
        self, request: Request, call: Call, usage: Usage
    ) -> Mapping[str, str] | Response | None:
        verified = getattr(request.state, "x402", None)
        if verified is None:
            return None
        try:
            settled = await self.paywall.settle(verified)
        except PaymentRefused as refused:
            return self._refusal(request, refused)
        log.info(
            "paid %s by %s: %s",
            self.paywall.token.show(self.price),
            settled.payer,
            settled.transaction,
        )
        return {RESPONSE_HEADER: settled.header}

    async def release(self, request: Request) -> None:
        """The call failed before settling: its payment may pay another call."""
        verified = getattr(request.state, "x402", None)
        if verified is not None:
            self.paywall.release_claim(verified.claim)

    def _refusal(self, request: Request, refused: PaymentRefused) -> Response:
        headers, required = self.paywall.payment_required(
            self.requirements, str(request.url), self.description, refused.reason
        )
        message = (
            f"payment required: {self.paywall.token.show(self.price)} per call over x402"
            if refused.reason == "payment_required"
            else str(refused)
        )
        error = {
            "message": message,
            "type": "payment_required",
            "param": None,
            "code": refused.reason,
        }
        return JSONResponse(
            {"error": error, **{k: v for k, v in required.items() if k != "error"}}, 402, headers
        )
