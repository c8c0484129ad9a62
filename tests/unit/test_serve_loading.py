"""`dtrain serve` listens before its model is loaded: `serve.cli.run` in this process (uvicorn
on a thread) over a toy GPT-2 folder whose loading waits for the test's go-ahead. It logs that
it listens at once; calls made while it loads are HTTP 503s saying so (with Retry-After), and
/health says not ready; once it is loaded it announces it on stdout (as before) and the same
calls are answered by the model. A loader that fails stops the server with its error in one
line; until then calls are 503s naming it."""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn
from harness.served import listening
from openai import OpenAI

from dtrain_node.serve import cli
from dtrain_node.serve.config import ServeConfig
from dtrain_node.serve.engine import Sampling, TransformersEngine
from dtrain_node.serve.loading import RETRY_AFTER_S, Loading, ModelLoadFailed
from dtrain_node.serve.source import ModelRefused, Verified
from dtrain_node.train.toy_models import save

CHECKPOINT = bytes(range(32))
MODEL = "dtrain-job-7"
CFG = ServeConfig(7, CHECKPOINT, port=0, max_tokens_cap=64)
Emitted = tuple[dict[str, Any], str]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("toy") / "gpt2"
    save("gpt2", path)
    return path


class Running:
    """`cli.run` on a thread: what it emits (in order), its uvicorn server, how it ended."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, verified: Callable[[], Verified]) -> None:
        self.emitted: queue.Queue[Emitted] = queue.Queue()
        self.logged: queue.Queue[str] = queue.Queue()
        self._log = logging.getLogger("dtrain.serve")
        self._handler = logging.Handler()
        self._handler.emit = lambda record: self.logged.put(record.getMessage())  # type: ignore[method-assign]
        self._log.addHandler(self._handler)
        self.servers: list[uvicorn.Server] = []
        self.error: BaseException | None = None
        make_server = cli.uvicorn_server

        def recorded(app: object) -> uvicorn.Server:
            self.servers.append(make_server(app))
            return self.servers[-1]

        monkeypatch.setattr(cli, "uvicorn_server", recorded)
        monkeypatch.setattr(cli, "emit", lambda ctx, data, human: self.emitted.put((data, human)))
        self.thread = threading.Thread(target=self._run, args=(verified,), daemon=True)
        self.thread.start()

    def _run(self, verified: Callable[[], Verified]) -> None:
        try:
            cli.run(SimpleNamespace(as_json=False), CFG, verified)  # type: ignore[arg-type]
        except BaseException as exc:
            self.error = exc

    def next(self) -> Emitted:
        return self.emitted.get(timeout=120)

    def listening(self) -> str:
        """The URL of the log line saying it listens while the model loads."""
        line = self.logged.get(timeout=120)
        m = re.fullmatch(rf"{MODEL}: listening at (http://\S+/v1) while the model loads \(.*", line)
        assert m, line
        return m.group(1)

    def stop(self) -> None:
        if self.servers:
            self.servers[0].should_exit = True
        self.thread.join(60)
        self._log.removeHandler(self._handler)
        assert not self.thread.is_alive()


@pytest.fixture
def gated(
    monkeypatch: pytest.MonkeyPatch, folder: Path
) -> Iterator[tuple[Running, threading.Event]]:
    """The server of the toy model, whose loading (verify, then the real engine load) waits for
    the event."""
    go = threading.Event()

    def verified() -> Verified:
        assert go.wait(120), "the test never let the model load"
        return Verified(folder, CHECKPOINT)

    running = Running(monkeypatch, verified)
    try:
        yield running, go
    finally:
        go.set()
        running.stop()


def test_it_listens_at_once_answers_503_while_loading_then_the_model(
    gated: tuple[Running, threading.Event], folder: Path
) -> None:
    running, go = gated
    url = running.listening()
    base = url.removesuffix("/v1")

    body = {"model": MODEL, "prompt": "def ", "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{url}/completions", json=body, timeout=30)
    assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_S)
    error = r.json()["error"]
    assert error["code"] == "model_loading" and error["type"] == "server_error"
    assert f"The model {MODEL} is loading" in error["message"]
    for path in ("/v1/models", "/v1/chat/completions"):
        assert httpx.get(base + path, timeout=30).status_code == 503
    health = httpx.get(f"{base}/health", timeout=30)
    assert health.status_code == 503 and health.json() == {"status": "loading", "model": MODEL}
    assert running.emitted.empty()  # not announced as serving while it loads

    go.set()
    data, human = running.next()
    assert data["listening"] is True and data["engine"] == "transformers" and data["url"] == url
    assert human.startswith(f"serving {MODEL} (checkpoint 0x{CHECKPOINT.hex()[:16]}..")
    health = httpx.get(f"{base}/health", timeout=30)
    assert health.status_code == 200 and health.json() == {"status": "ready", "model": MODEL}
    client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    answer = client.completions.create(**body)
    local = TransformersEngine(folder)
    steps = local.generate(local.prompt_ids("def "), Sampling(8, 0.0), threading.Event())
    assert answer.choices[0].text == "".join(s.text for s in steps)
    assert client.models.list().data[0].id == MODEL

    running.stop()
    assert running.error is None
    assert running.next() == ({"stopped": True}, "stopped serving")


@pytest.mark.parametrize(
    ("raised", "expected", "message"),
    [
        (
            ModelRefused("/m does not load as a model: bad header"),
            ModelRefused,
            "/m does not load as a model: bad header",
        ),
        (
            OSError("No space left on device\nmore"),
            ModelLoadFailed,
            "cannot load the model of job 7: No space left on device",
        ),
    ],
)
def test_a_model_that_fails_to_load_stops_the_server_with_its_error(
    monkeypatch: pytest.MonkeyPatch, raised: Exception, expected: type, message: str
) -> None:
    go = threading.Event()

    def verified() -> Verified:
        assert go.wait(120)
        raise raised

    running = Running(monkeypatch, verified)
    try:
        r = httpx.get(running.listening() + "/models", timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        go.set()
        running.thread.join(60)  # the failure stops the server: run returns by raising
        assert not running.thread.is_alive()
    finally:
        go.set()
        running.stop()
    assert type(running.error) is expected and str(running.error) == message
    assert running.emitted.empty()  # neither "serving" nor "stopped serving"


def test_until_it_stops_a_failed_load_is_a_503_naming_the_error() -> None:
    gate = Loading(MODEL)
    with listening(gate) as base:
        assert not gate.wait(0) and gate.state == "loading"
        gate.failed("cannot load the model of job 7: disk full")
        assert gate.wait(0) and gate.state == "failed"
        r = httpx.post(f"{base}/v1/completions", json={}, timeout=30)
        assert r.status_code == 503 and "retry-after" not in r.headers
        error = r.json()["error"]
        assert error["code"] == "model_load_failed"
        assert error["message"] == (
            f"The model {MODEL} failed to load: cannot load the model of job 7: disk full"
        )
        health = httpx.get(f"{base}/health", timeout=30).json()
        assert health["status"] == "failed" and "disk full" in health["error"]
