"""The HTTP API: /v1/models, /v1/completions and /v1/chat/completions as OpenAI serves them
(JSON bodies, or server-sent events `data: {...}` ending with `data: [DONE]` when `stream` is
true). Every generating call is checked (`validate`), admitted by the `Payment`, then run on
the single generation `Worker`."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from dtrain_node.serve.config import ServeConfig
from dtrain_node.serve.engine import Engine, Step
from dtrain_node.serve.loading import HEALTH_PATH
from dtrain_node.serve.payment import Free, Payment, Usage
from dtrain_node.serve.protocol import ApiError, ChatRequest, CompletionRequest, error_body
from dtrain_node.serve.validate import Plan, chat_plan, completion_plan
from dtrain_node.serve.worker import Worker

log = logging.getLogger("dtrain.serve")
Choice = tuple[int, Step]  # (choice index, step)


class Api:
    """What the routes do: the model card, and a checked call admitted, run and answered."""

    def __init__(self, engine: Engine, cfg: ServeConfig, payment: Payment) -> None:
        self.engine, self.cfg, self.payment = engine, cfg, payment
        self.worker = Worker()
        self.created = int(time.time())

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.cfg.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "dtrain",
            "job_id": self.cfg.job_id,
            "checkpoint": "0x" + self.cfg.checkpoint.hex(),
            "context_length": self.engine.context,
            "engine": self.engine.name,
        }

    def shape(self, kind: str) -> Shape:
        return Shape(kind, self.cfg)

    async def serve(self, request: Request, plan: Plan, shape: Shape) -> Response:
        admission = await self.payment.admit(request, plan.call)
        if admission.refusal is not None:
            return admission.refusal
        headers = dict(admission.headers)
        if plan.call.stream:
            return StreamingResponse(
                _sse(request, plan, shape, self),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache"},
            )
        t0 = time.monotonic()
        try:
            finals = await self.worker.run(lambda c: _complete(self.engine, plan, c))
        except BaseException:
            release = getattr(self.payment, "release", None)
            if release is not None:  # not served, not settled: the payment is not spent
                await release(request)
            raise
        usage = Usage(plan.prompt_tokens, sum(s.tokens for s in finals))
        _log(plan, usage, t0)
        settled = await self.payment.settle(request, plan.call, usage)
        if isinstance(settled, Response):
            return settled  # the payment did not settle: the answer is withheld
        headers.update(settled or {})
        return JSONResponse(shape.body(finals, usage), headers=headers)


def create_app(engine: Engine, cfg: ServeConfig, payment: Payment | None = None) -> FastAPI:
    api = Api(engine, cfg, payment or Free())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        api.worker.close()

    app = FastAPI(
        title="dtrain serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    _error_handlers(app)

    @app.get(HEALTH_PATH)
    async def health() -> dict[str, Any]:
        """Ready: the model is loaded (while it loads, `Loading` answers 503 here)."""
        return {"status": "ready", "model": cfg.model_id}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [api.model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if model != cfg.model_id:
            raise ApiError(
                f"The model `{model}` does not exist.", "model", "model_not_found", status=404
            )
        return api.model_card()

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        plan = completion_plan(req, engine, cfg)
        return await api.serve(request, plan, api.shape("text_completion"))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> Response:
        plan = chat_plan(req, engine, cfg)
        return await api.serve(request, plan, api.shape("chat.completion"))

    return app


class Shape:
    """Response bodies and stream chunks of one call, as OpenAI shapes them."""

    def __init__(self, kind: str, cfg: ServeConfig) -> None:
        self.chat = kind == "chat.completion"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.head = {
            "id": self.id,
            "created": int(time.time()),
            "model": cfg.model_id,
            "system_fingerprint": cfg.fingerprint,
        }

    def body(self, finals: list[Step], usage: Usage) -> dict[str, Any]:
        choices = [self._choice(i, s) for i, s in enumerate(finals)]
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self.head, "object": kind, "choices": choices, "usage": usage.as_dict()}

    def _choice(self, i: int, s: Step) -> dict[str, Any]:
        if self.chat:
            message = {"role": "assistant", "content": s.text}
            return {
                "index": i,
                "message": message,
                "finish_reason": s.finish_reason,
                "logprobs": None,
            }
        return {"index": i, "text": s.text, "finish_reason": s.finish_reason, "logprobs": None}

    def chunk(self, i: int, text: str | None, finish: str | None, first: bool = False) -> dict:
        if self.chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": i, "delta": delta, "finish_reason": finish, "logprobs": None}
            return {**self.head, "object": "chat.completion.chunk", "choices": [choice]}
        choice = {"index": i, "text": text or "", "finish_reason": finish, "logprobs": None}
        return {**self.head, "object": "text_completion", "choices": [choice]}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self.head, "object": kind, "choices": [], "usage": usage.as_dict()}


def _complete(engine: Engine, plan: Plan, cancelled: threading.Event) -> list[Step]:
    """Each prompt's whole completion, as one step with its finish reason."""
    out = []
    for ids in plan.prompts:
        steps = list(engine.generate(ids, plan.sampling, cancelled))
        text = "".join(s.text for s in steps)
        out.append(Step(text, steps[-1].tokens, steps[-1].finish_reason))
    return out


def _choices(engine: Engine, plan: Plan, cancelled: threading.Event) -> Iterator[Choice]:
    for i, ids in enumerate(plan.prompts):
        for step in engine.generate(ids, plan.sampling, cancelled):
            yield i, step


async def _sse(request: Request, plan: Plan, shape: Shape, api: Api) -> AsyncIterator[str]:
    t0, tokens = time.monotonic(), [0] * len(plan.prompts)
    if shape.chat:
        yield _event(shape.chunk(0, None, None, first=True))
    async for i, step in api.worker.stream(lambda c: _choices(api.engine, plan, c)):
        tokens[i] = step.tokens
        if step.text or step.finish_reason:
            yield _event(shape.chunk(i, step.text, step.finish_reason))
    usage = Usage(plan.prompt_tokens, sum(tokens))
    if plan.include_usage:
        yield _event(shape.usage_chunk(usage))
    yield "data: [DONE]\n\n"
    _log(plan, usage, t0)
    await api.payment.settle(request, plan.call, usage)


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def _log(plan: Plan, usage: Usage, t0: float) -> None:
    log.info(
        "%s: %d prompt + %d completion tokens in %.2fs%s",
        plan.call.endpoint,
        usage.prompt_tokens,
        usage.completion_tokens,
        time.monotonic() - t0,
        " (streamed)" if plan.call.stream else "",
    )


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message, param = f"The request body is not valid JSON: {first.get('msg')}", None
        elif not loc:
            message, param = "The request body must be a JSON object", None
        else:
            message, param = f"{'.'.join(loc)}: {first.get('msg')}", loc[0]
        return JSONResponse(error_body(message, "invalid_request_error", param), 400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return JSONResponse(
            error_body(str(exc.detail), "invalid_request_error"), exc.status_code, exc.headers
        )

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s", request.url.path)
        return JSONResponse(error_body(f"internal error: {exc}", "server_error"), 500)
