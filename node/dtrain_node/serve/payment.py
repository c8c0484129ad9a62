"""The paying seam: the app asks a `Payment` before every generating call.

`Free` (this module) lets every call through. A paid server (x402) implements the same
protocol: `admit` reads the request's payment header and answers with a `refusal` (HTTP 402
and its payment requirements) or an admission carrying response headers (the settlement
receipt); `settle` runs once the call is done, with the tokens it used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response


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

    async def settle(self, request: Request, call: Call, usage: Usage) -> None: ...


class Free:
    """Every call admitted, nothing to settle: `dtrain serve` without a price."""

    async def admit(self, request: Request, call: Call) -> Admission:
        return Admission()

    async def settle(self, request: Request, call: Call, usage: Usage) -> None:
        return None
