"""`dtrain serve JOB`: fetch (or take) the job's verified final model and serve it over an
OpenAI-compatible HTTP API until Ctrl-C."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import click

from dtrain.cli import Ctx, emit
from dtrain.errors import ConfigError
from dtrain_node.serve.config import DEFAULT_MAX_TOKENS_CAP, ServeConfig

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(message)s"
GRACE_S = 5  # in-flight calls get this long to finish on Ctrl-C


@click.command("serve")
@click.argument("job_id", type=int)
@click.option("--host", default="127.0.0.1", show_default=True, help="IP address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="TCP port to listen on (0: any free one; the listening line names it).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where the fetched model is exported [default: a temporary folder, removed on exit].",
)
@click.option(
    "--model-dir",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    default=None,
    help="Serve this folder (a `dtrain job fetch` export) instead of fetching: its "
    "CHECKPOINT_SHA256 and its weights must both match the job's on-chain final checkpoint.",
)
@click.option(
    "--max-tokens-cap",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_TOKENS_CAP,
    show_default=True,
    help="The most tokens one completion may ask for (max_tokens above it: HTTP 400).",
)
@click.option(
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait for the operators' checkpoint when fetching.",
)
@click.pass_obj
def serve(
    ctx: Ctx,
    job_id: int,
    host: str,
    port: int,
    out: Path | None,
    model_dir: Path | None,
    max_tokens_cap: int,
    timeout: float,
) -> None:
    """Serve a completed job's final model over an OpenAI-compatible HTTP API: /v1/models,
    /v1/completions and /v1/chat/completions (streaming too), model id dtrain-job-JOB.

    The model is the job's final checkpoint, fetched from its operators and verified against
    its on-chain hash (or --model-dir, checked the same way), prompted as the job trained it
    (chat messages through its tokenizer's chat template). One generation runs at a time;
    others wait their turn. Serves until Ctrl-C.

    \b
    Example:
      dtrain serve 1 --port 8000
      curl localhost:8000/v1/completions -H 'content-type: application/json' \\
        -d '{"model": "dtrain-job-1", "prompt": "def ", "max_tokens": 32}'
    """
    from dtrain_node.serve import source

    if out is not None and model_dir is not None:
        raise click.UsageError("give --out (where to fetch to) or --model-dir, not both")
    bsm = ctx.bsm(signing=False)
    with contextlib.ExitStack() as stack:
        if model_dir is not None:
            verified = source.exported(bsm.job(job_id), model_dir)
        else:
            if out is None:
                out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dtrain-model-")))
            verified = source.fetched(bsm, job_id, out, timeout)
        cfg = ServeConfig(job_id, verified.checkpoint, host, port, max_tokens_cap)
        run(ctx, cfg, verified.folder, verified.model)


def run(ctx: Ctx, cfg: ServeConfig, folder: Path, model: object | None = None) -> None:
    """Load the model in `folder`, listen, announce it, serve until Ctrl-C or SIGTERM."""
    from transformers.utils import logging as hf_logging

    from dtrain_node.serve.app import create_app
    from dtrain_node.serve.engine import TransformersEngine, engine_note

    hf_logging.set_verbosity_error()  # not a warning per prompt longer than the context
    engine = TransformersEngine(folder, model)
    app = create_app(engine, cfg)
    sock = listen(cfg.host, cfg.port)
    port = sock.getsockname()[1]
    url = f"http://{url_host(cfg.host)}:{port}/v1"
    _log_requests()
    emit(
        ctx,
        {
            "job_id": cfg.job_id,
            "model": cfg.model_id,
            "checkpoint": cfg.checkpoint.hex(),
            "engine": engine.name,
            "url": url,
            "listening": True,
        },
        f"serving {cfg.model_id} (checkpoint 0x{cfg.checkpoint.hex()[:16]}.., engine "
        f"{engine_note()}) at {url}: listening until Ctrl-C",
    )
    sys.stdout.flush()
    with sock:
        serve_until_signal(app, sock)
    emit(ctx, {"stopped": True}, "stopped serving")


def serve_until_signal(app: object, sock: socket.socket) -> None:
    """Serve `app` on `sock` until Ctrl-C or SIGTERM: calls in flight get GRACE_S to finish (a
    second Ctrl-C cuts them short). Unlike uvicorn's own, the signal is not raised again once
    stopped, so the command ends normally."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            signals = (signal.SIGINT, signal.SIGTERM)
            previous = {s: signal.signal(s, self.handle_exit) for s in signals}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=GRACE_S
    )
    Server(config).run(sockets=[sock])


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (a one-line `ConfigError` when it cannot be had)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1" if host == "0.0.0.0" else "[::1]"
    return f"[{host}]" if ":" in host else host


def _log_requests() -> None:
    """One line per answered call on stderr."""
    log = logging.getLogger("dtrain.serve")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, "%Y-%m-%d %H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
