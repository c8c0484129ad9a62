"""`dtrain serve`'s HTTP API in-process (uvicorn on a thread) over a toy GPT-2 folder, used as a
user would: through the official `openai` client. Greedy answers are transformers' own
`generate` of the prompt as training formats it; bad requests are OpenAI-shaped 400s; calls
are served one at a time; a client leaving mid-stream stops its generation, not the server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from harness.served import served as harness_served
from openai import OpenAI
from starlette.requests import Request
from starlette.responses import JSONResponse

from dtrain_node.serve.config import ServeConfig
from dtrain_node.serve.engine import Sampling, Step, TransformersEngine
from dtrain_node.serve.payment import Admission, Call, Payment, Usage
from dtrain_node.train.finetune import Coder
from dtrain_node.train.toy_models import save

CHECKPOINT = bytes(range(32))
CAP = 200
MODEL = "dtrain-job-7"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def main("}]


class Counting:
    """An engine that records how many generations run at once and how each one ended; with
    `gate`, each generation waits for it after its first step."""

    def __init__(self, engine: TransformersEngine, gate: threading.Event | None = None) -> None:
        self.engine, self.gate = engine, gate
        self.name, self.context = engine.name, engine.context
        self.lock = threading.Lock()
        self.active = self.peak = 0
        self.tokens: list[int] = []  # generated per finished generation
        self.ended = threading.Event()

    def prompt_ids(self, prompt: Any) -> list[int]:
        return self.engine.prompt_ids(prompt)

    def generate(
        self, ids: list[int], sampling: Sampling, cancelled: threading.Event
    ) -> Iterator[Step]:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        n = 0
        try:
            for step in self.engine.generate(ids, sampling, cancelled):
                n = step.tokens
                yield step
                if self.gate is not None:
                    assert self.gate.wait(30)
        finally:
            with self.lock:
                self.active -= 1
                self.tokens.append(n)
            self.ended.set()


@contextmanager
def served(engine: Any, payment: Payment | None = None) -> Iterator[str]:
    """The app on a free loopback port, in this process; its base URL."""
    with harness_served(engine, ServeConfig(7, CHECKPOINT, max_tokens_cap=CAP), payment) as url:
        yield url


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("toy") / "gpt2"
    save("gpt2", path)
    return path


@pytest.fixture(scope="module")
def engine(folder: Path) -> TransformersEngine:
    return TransformersEngine(folder)


@pytest.fixture(scope="module")
def url(engine: TransformersEngine) -> Iterator[str]:
    with served(engine) as u:
        yield u


@pytest.fixture
def client(url: str) -> OpenAI:
    return OpenAI(base_url=url, api_key="unused", max_retries=0)


def reference(engine: TransformersEngine, ids: list[int], max_new: int) -> str:
    """transformers' greedy `generate` over the tokenizer's vocabulary, decoded as training
    decodes (`Coder.decode`), up to EOS."""
    vocab, rows = engine.vocab, engine.model.config.vocab_size
    out = engine.model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new,
        suppress_tokens=list(range(vocab, rows)),
        eos_token_id=engine.coder.eos,
        pad_token_id=engine.coder.pad,
    )[0, len(ids) :].tolist()
    if engine.coder.eos in out:
        out = out[: out.index(engine.coder.eos)]
    return engine.coder.decode(out)


def test_models_lists_the_job_model_with_its_checkpoint(client: OpenAI) -> None:
    [m] = client.models.list().data
    assert m.id == MODEL and m.owned_by == "dtrain"
    extra = m.model_dump()
    assert extra["checkpoint"] == "0x" + CHECKPOINT.hex() and extra["job_id"] == 7
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_greedy_completion_is_transformers_generate_of_the_training_prompt(
    client: OpenAI, engine: TransformersEngine, folder: Path
) -> None:
    from transformers import AutoTokenizer

    r = client.completions.create(model=MODEL, prompt="import os\n", max_tokens=12, temperature=0)
    ids = Coder(AutoTokenizer.from_pretrained(folder)).prompt("import os\n")  # BOS + tokens
    assert r.choices[0].text == reference(engine, ids, 12)
    assert r.model == MODEL and r.object == "text_completion"
    assert r.usage is not None and r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens <= 12
    assert r.choices[0].finish_reason in ("stop", "length")


def test_chat_goes_through_the_chat_template_with_the_generation_prompt(
    client: OpenAI, engine: TransformersEngine, folder: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|assistant|>")
    ids = tok.encode(text, add_special_tokens=False)
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, temperature=0)
    assert r.usage is not None and r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == reference(engine, ids, 10)


def test_streams_join_to_the_unstreamed_answer(client: OpenAI) -> None:
    args: dict[str, Any] = {"model": MODEL, "max_tokens": 15, "temperature": 0}
    whole = client.completions.create(prompt="class A:", **args).choices[0].text
    chunks = list(
        client.completions.create(
            prompt="class A:", stream=True, stream_options={"include_usage": True}, **args
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")

    answer = client.chat.completions.create(messages=CHAT, **args).choices[0].message.content
    stream = list(client.chat.completions.create(messages=CHAT, stream=True, **args))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == answer
    assert stream[-1].choices[0].finish_reason in ("stop", "length")


def test_a_seed_makes_sampling_repeatable(client: OpenAI) -> None:
    def sample(seed: int) -> str:
        r = client.completions.create(
            model=MODEL, prompt="x = ", max_tokens=12, temperature=1.5, top_p=0.9, seed=seed
        )
        return r.choices[0].text

    assert sample(1) == sample(1)
    assert len({sample(s) for s in range(4)}) > 1


def test_a_stop_string_ends_the_text_before_it(client: OpenAI) -> None:
    args: dict[str, Any] = {"model": MODEL, "prompt": "def f(", "temperature": 0}
    full = client.completions.create(max_tokens=20, **args).choices[0].text
    stop = full.strip()[len(full.strip()) // 2 :][:3]
    assert stop
    r = client.completions.create(max_tokens=20, stop=[stop], **args).choices[0]
    assert r.text == full[: full.index(stop)] and r.finish_reason == "stop"
    streamed = client.completions.create(max_tokens=20, stop=stop, stream=True, **args)
    assert "".join(c.choices[0].text for c in streamed) == r.text


@pytest.mark.parametrize(
    ("kwargs", "param", "code"),
    [
        ({"model": "gpt-4o"}, "model", "model_not_found"),
        ({"prompt": ""}, "prompt", None),
        ({"prompt": []}, "prompt", None),
        ({"max_tokens": CAP + 1}, "max_tokens", None),
        ({"max_tokens": 10**12}, "max_tokens", None),
        ({"max_tokens": 0}, "max_tokens", None),
        ({"temperature": -0.5}, "temperature", None),
        ({"top_p": 0}, "top_p", None),
        ({"n": 2}, "n", None),
        ({"logprobs": 2}, "logprobs", None),
        ({"prompt": "def f(x):\n" * 300}, "prompt", "context_length_exceeded"),
        ({"prompt": "a " * 120, "max_tokens": CAP}, "max_tokens", "context_length_exceeded"),
    ],
)
def test_bad_completion_requests_are_openai_400s(
    client: OpenAI, kwargs: dict[str, Any], param: str, code: str | None
) -> None:
    args = {"model": MODEL, "prompt": "hello", "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**args)
    assert err.value.status_code == 400
    body = err.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error"
    assert body["param"] == param and body["code"] == code and body["message"]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": []}, "messages"),
        ({"model": "nope"}, "model"),
        ({"max_completion_tokens": CAP + 1}, "max_completion_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, "messages"),
        ({"stream": True, "n": 3}, "n"),
    ],
)
def test_bad_chat_requests_are_openai_400s(
    client: OpenAI, kwargs: dict[str, Any], param: str
) -> None:
    args = {"model": MODEL, "messages": CHAT, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**args)
    assert isinstance(err.value.body, dict) and err.value.body["param"] == param


@pytest.mark.parametrize(
    "content", [b"{not json", b"[]", b"", b'{"model": "dtrain-job-7", "prompt": 5}']
)
def test_malformed_bodies_are_openai_400s(url: str, content: bytes) -> None:
    r = httpx.post(
        f"{url}/completions", content=content, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]


def test_unknown_path_is_an_openai_404(url: str) -> None:
    r = httpx.get(f"{url}/embeddings")
    assert r.status_code == 404 and r.json()["error"]["message"]


def test_concurrent_calls_are_served_one_at_a_time_and_all_answered(
    engine: TransformersEngine,
) -> None:
    counting = Counting(engine)
    answers: list[str] = []
    errors: list[BaseException] = []
    with served(counting) as u:
        client = OpenAI(base_url=u, api_key="unused", max_retries=0, timeout=120)

        def call(i: int) -> None:
            try:
                if i % 2:
                    r = client.completions.create(
                        model=MODEL, prompt=f"n = {i}", max_tokens=8, temperature=0
                    )
                    answers.append(r.choices[0].text)
                else:
                    s = client.chat.completions.create(
                        model=MODEL, messages=CHAT, max_tokens=8, temperature=0, stream=True
                    )
                    answers.append("".join(c.choices[0].delta.content or "" for c in s))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors and len(answers) == 6
    assert counting.peak == 1 and len(counting.tokens) == 6


def test_a_client_leaving_mid_stream_stops_its_generation_not_the_server(
    engine: TransformersEngine,
) -> None:
    gate = threading.Event()
    counting = Counting(engine, gate)
    with served(counting) as u:
        body = {"model": MODEL, "prompt": "def ", "max_tokens": CAP, "temperature": 0}
        body["stream"] = True
        with httpx.stream("POST", f"{u}/completions", json=body, timeout=60) as r:
            first = next(r.iter_lines())
            assert first.startswith("data: {")
        gate.set()  # the client is gone: let the generation go on, to notice it
        assert counting.ended.wait(60), "the abandoned generation never ended"
        assert counting.tokens[0] < CAP  # it stopped early, cancelled
        client = OpenAI(base_url=u, api_key="unused", max_retries=0)
        r2 = client.completions.create(model=MODEL, prompt="x", max_tokens=3, temperature=0)
        assert r2.choices[0].finish_reason in ("stop", "length")


class Priced:
    """A payment seam stand-in: refuses calls without an X-PAYMENT header (HTTP 402), admits
    others with a receipt header and records what it settles."""

    def __init__(self) -> None:
        self.settled: list[tuple[Call, Usage]] = []

    async def admit(self, request: Request, call: Call) -> Admission:
        if "x-payment" not in request.headers:
            body = {"error": {"message": "pay first", "type": "payment_required"}}
            return Admission(refusal=JSONResponse(body, 402))
        return Admission(headers={"X-PAYMENT-RESPONSE": "receipt"})

    async def settle(self, request: Request, call: Call, usage: Usage) -> None:
        self.settled.append((call, usage))


def test_every_generating_call_goes_through_the_payment_seam(
    engine: TransformersEngine,
) -> None:
    priced, counting = Priced(), Counting(engine)
    with served(counting, priced) as u:
        client = OpenAI(base_url=u, api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            client.completions.create(model=MODEL, prompt="x", max_tokens=3)
        assert err.value.status_code == 402 and not counting.tokens  # nothing generated
        assert client.models.list().data[0].id == MODEL  # listing models is free
        paid = OpenAI(
            base_url=u, api_key="unused", max_retries=0, default_headers={"X-PAYMENT": "p"}
        )
        raw = paid.completions.with_raw_response.create(
            model=MODEL, prompt="x", max_tokens=3, temperature=0
        )
        assert raw.headers["x-payment-response"] == "receipt"
        usage = raw.parse().usage
        list(paid.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, stream=True))
    [(call, got), (chat_call, _)] = priced.settled
    assert call.endpoint == "completions" and call.max_tokens == 3 and not call.stream
    assert usage is not None and got.total_tokens == usage.total_tokens
    assert chat_call.endpoint == "chat.completions" and chat_call.stream
