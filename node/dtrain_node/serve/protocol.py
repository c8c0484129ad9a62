"""The OpenAI API's request bodies (the fields this server reads; others are ignored) and its
error shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse


class ApiError(Exception):
    """An OpenAI-shaped error response."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = (
            message,
            param,
            code,
            status,
            kind,
        )

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.kind, self.param, self.code), self.status)


def error_body(
    message: str, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class Common(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: Any = None

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[TextPart] | None = None


class ChatRequest(Common):
    messages: list[Message] = Field(min_length=0)
    max_completion_tokens: int | None = None
    tools: list[Any] | None = None
