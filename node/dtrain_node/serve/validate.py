"""A request body checked against the model and the server's limits, turned into what the
engine runs: the prompts' token ids and the sampling settings. Every refusal is an `ApiError`
(HTTP 400 in OpenAI's shape) naming the offending parameter."""

from __future__ import annotations

from dataclasses import dataclass

from dtrain_node.serve.config import COMPLETION_DEFAULT_MAX_TOKENS, ServeConfig
from dtrain_node.serve.engine import Engine, Messages, PromptError, Sampling
from dtrain_node.serve.payment import Call
from dtrain_node.serve.protocol import ApiError, ChatRequest, Common, CompletionRequest

MAX_STOPS = 4  # as OpenAI


@dataclass(frozen=True)
class Plan:
    prompts: list[list[int]]  # token ids of each prompt (one choice each)
    sampling: Sampling
    call: Call
    include_usage: bool = False  # a stream ends with a chunk of the token counts

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def completion_plan(req: CompletionRequest, engine: Engine, cfg: ServeConfig) -> Plan:
    _check_common(req, cfg)
    if req.echo:
        raise ApiError("echo is not supported", "echo")
    if req.suffix:
        raise ApiError("suffix is not supported", "suffix")
    if req.best_of not in (None, 1):
        raise ApiError("best_of must be 1 on this server", "best_of")
    texts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    if not texts:
        raise ApiError("prompt must not be empty", "prompt")
    if not all(isinstance(t, str) for t in texts):
        raise ApiError("token-id prompts are not supported: send the prompt as text", "prompt")
    if any(not t for t in texts):
        raise ApiError("prompt must not be empty", "prompt")
    prompts = [_ids(engine, t, "prompt") for t in texts]  # type: ignore[arg-type]
    budget = _budget(
        req.max_tokens, "max_tokens", COMPLETION_DEFAULT_MAX_TOKENS, prompts, engine, cfg
    )
    return _plan("completions", req, prompts, budget)


def chat_plan(req: ChatRequest, engine: Engine, cfg: ServeConfig) -> Plan:
    _check_common(req, cfg)
    if req.tools:
        raise ApiError("tools are not supported", "tools")
    if not req.messages:
        raise ApiError("messages must not be empty", "messages")
    messages: Messages = []
    for i, m in enumerate(req.messages):
        if isinstance(m.content, list):
            if any(p.type != "text" for p in m.content):
                raise ApiError("only text content is supported", f"messages[{i}].content")
            content = "".join(p.text or "" for p in m.content)
        else:
            content = m.content or ""
        messages.append({"role": m.role, "content": content})
    prompts = [_ids(engine, messages, "messages")]
    param, asked = (
        ("max_completion_tokens", req.max_completion_tokens)
        if req.max_completion_tokens is not None
        else ("max_tokens", req.max_tokens)
    )
    budget = _budget(asked, param, cfg.max_tokens_cap, prompts, engine, cfg)
    return _plan("chat.completions", req, prompts, budget)


def _check_common(req: Common, cfg: ServeConfig) -> None:
    if req.model != cfg.model_id:
        raise ApiError(
            f"The model `{req.model}` does not exist. This server serves `{cfg.model_id}`.",
            "model",
            "model_not_found",
        )
    if req.n not in (None, 1):
        raise ApiError(f"n must be 1 on this server, got {req.n}", "n")
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        raise ApiError(f"temperature must be between 0 and 2, got {req.temperature}", "temperature")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise ApiError(f"top_p must be in (0, 1], got {req.top_p}", "top_p")
    if len(req.stops()) > MAX_STOPS:
        raise ApiError(f"at most {MAX_STOPS} stop sequences", "stop")
    if req.logprobs not in (None, False):
        raise ApiError("logprobs are not supported", "logprobs")


def _ids(engine: Engine, prompt: str | Messages, param: str) -> list[int]:
    try:
        ids = engine.prompt_ids(prompt)
    except PromptError as exc:
        raise ApiError(str(exc), param) from None
    if len(ids) >= engine.context:
        raise ApiError(
            f"This model's maximum context length is {engine.context} tokens; the {param} is "
            f"{len(ids)} tokens, which leaves no room for a completion. Shorten the {param}.",
            param,
            "context_length_exceeded",
        )
    return ids


def _budget(
    asked: int | None,
    param: str,
    default: int,
    prompts: list[list[int]],
    engine: Engine,
    cfg: ServeConfig,
) -> int:
    """The most tokens each completion may have."""
    room = engine.context - max(len(p) for p in prompts)
    if asked is None:
        return min(default, cfg.max_tokens_cap, room)
    if asked < 1:
        raise ApiError(f"{param} must be at least 1, got {asked}", param)
    if asked > cfg.max_tokens_cap:
        raise ApiError(
            f"{param} is {asked}; this server allows at most {cfg.max_tokens_cap}", param
        )
    if asked > room:
        used = engine.context - room
        raise ApiError(
            f"This model's maximum context length is {engine.context} tokens. However, you "
            f"requested {used + asked} tokens ({used} in the prompt, {asked} for the "
            f"completion). Reduce the prompt or {param}.",
            param,
            "context_length_exceeded",
        )
    return asked


def _plan(endpoint: str, req: Common, prompts: list[list[int]], budget: int) -> Plan:
    sampling = Sampling(
        max_tokens=budget,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        stop=req.stops(),
        seed=req.seed,
    )
    call = Call(
        endpoint=endpoint,
        model=req.model,
        prompt_tokens=sum(len(p) for p in prompts),
        max_tokens=budget * len(prompts),
        stream=bool(req.stream),
    )
    return Plan(prompts, sampling, call, req.include_usage)
