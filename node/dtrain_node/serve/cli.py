"""`dtrain serve JOB`: fetch (or take) the job's verified final model and serve it over an
OpenAI-compatible HTTP API until Ctrl-C."""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dtrain.cli import Ctx, emit
from dtrain.errors import ConfigError, DtrainError
from dtrain_node.serve.config import DEFAULT_MAX_TOKENS_CAP, ServeConfig

if TYPE_CHECKING:
    import uvicorn

    from dtrain_node.serve.payment import X402
    from dtrain_node.serve.source import FetchFinal, Verified

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(message)s"
GRACE_S = 5  # in-flight calls get this long to finish on Ctrl-C

F = TypeVar("F", bound=Callable[..., Any])

# Options the HTTP services (`dtrain serve`, `dtrain gateway`) share.
host_option = click.option(
    "--host", default="127.0.0.1", show_default=True, help="IP address to listen on."
)
facilitator_key_option = click.option(
    "--facilitator-key",
    envvar="DTRAIN_FACILITATOR_KEY",
    default=None,
    help="The account that settles payments on-chain and pays their gas [env "
    "DTRAIN_FACILITATOR_KEY; default: --key].",
)


def port_option(default: int) -> Callable[[F], F]:
    return click.option(
        "--port",
        type=click.IntRange(0, 65535),
        default=default,
        show_default=True,
        help="TCP port to listen on (0: any free one; the listening line names it).",
    )


@click.command("serve")
@click.argument("job_id", type=int)
@host_option
@port_option(8000)
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
@click.option(
    "--price",
    default=None,
    help="Charge this many tokens (e.g. 0.05) per generating call, paid over x402 in --token; "
    "unpaid calls are answered HTTP 402 with the payment requirements.",
)
@click.option(
    "--token",
    default=None,
    help="The EIP-3009 token (address) calls are paid in, e.g. the devnet's TestUSD.",
)
@click.option(
    "--pay-to",
    default=None,
    help="Who is paid [default: the --key account].",
)
@facilitator_key_option
@click.pass_obj
def _serve(
    ctx: Ctx,
    job_id: int,
    host: str,
    port: int,
    out: Path | None,
    model_dir: Path | None,
    max_tokens_cap: int,
    timeout: float,
    price: str | None,
    token: str | None,
    pay_to: str | None,
    facilitator_key: str | None,
    fetch_final: FetchFinal,
) -> None:
    """Serve a completed job's final model over an OpenAI-compatible HTTP API: /v1/models,
    /v1/completions and /v1/chat/completions (streaming too), model id dtrain-job-JOB.

    The model is the job's final checkpoint, fetched from its operators and verified against
    its on-chain hash (or --model-dir, checked the same way), prompted as the job trained it
    (chat messages through its tokenizer's chat template). One generation runs at a time;
    others wait their turn. Serves until Ctrl-C.

    It listens at once: while the model is fetched, verified and loaded, every call is
    answered HTTP 503 (an OpenAI-shaped error, with Retry-After) and GET /health answers 503
    {"status": "loading"}, then 200 {"status": "ready"}. A model that fails to load stops
    the server with a one-line error.

    With --price each call is paid over x402 (`exact` EVM scheme, an EIP-3009 authorization
    of --token to --pay-to): verified before generating, settled on-chain by this process
    (the --facilitator-key account submits it) after.

    \b
    Example:
      dtrain serve 1 --port 8000
      curl localhost:8000/v1/completions -H 'content-type: application/json' \\
        -d '{"model": "dtrain-job-1", "prompt": "def ", "max_tokens": 32}'
      dtrain serve 1 --price 0.05 --token 0x5FbD...  # 0.05 TestUSD a call
    """
    from dtrain_node.serve import source

    if out is not None and model_dir is not None:
        raise click.UsageError("give --out (where to fetch to) or --model-dir, not both")
    bsm = ctx.bsm(signing=False)
    payment = paid(ctx, job_id, price, token, pay_to, facilitator_key)
    job = bsm.job(job_id)
    cfg = ServeConfig(job_id, source.completed(job), host, port, max_tokens_cap)
    with contextlib.ExitStack() as stack:
        if model_dir is not None:
            folder = model_dir

            def verified() -> source.Verified:
                return source.exported(job, folder)

        else:
            if out is None:
                temporary = tempfile.TemporaryDirectory(
                    prefix="dtrain-model-", ignore_cleanup_errors=True
                )  # a fetch cut short by Ctrl-C may still be writing to it
                out = Path(stack.enter_context(temporary))
            target = out

            def verified() -> source.Verified:
                return source.fetched(bsm, job_id, target, timeout, fetch_final)

        run(ctx, cfg, verified, payment)


def command(fetch_final: FetchFinal) -> click.Command:
    """`dtrain serve`, fetching a job's final checkpoint with `fetch_final` (the operator's
    fetch: serving builds on it without importing it)."""
    cmd = copy.copy(_serve)
    cmd.callback = functools.partial(_serve.callback, fetch_final=fetch_final)
    return cmd


def paid(
    ctx: Ctx,
    job_id: int,
    price: str | None,
    token: str | None,
    pay_to: str | None,
    facilitator_key: str | None,
) -> X402 | None:
    """The x402 payment --price asks for (None: free), its token read from the chain."""
    if price is None:
        if token or pay_to or facilitator_key:
            raise click.UsageError("--token, --pay-to and --facilitator-key go with --price")
        return None
    from dtrain.client import connect, load_key
    from dtrain.x402 import LocalFacilitator, Paywall, Token, install_multicall
    from dtrain_node.serve.payment import X402

    if not token:
        raise click.UsageError("--price needs --token (the token calls are paid in)")
    assert ctx.rpc_url is not None  # ctx.bsm() checked it
    w3 = connect(ctx.rpc_url)
    coin = Token.read(w3, token)
    amount = coin.units(price)
    if amount == 0:
        raise click.UsageError("--price must be above 0 (leave it out to serve for free)")
    settler = facilitator_key or ctx.key
    if not settler:
        raise ConfigError("--price needs a key that settles payments: --facilitator-key or --key")
    payee = pay_to or (load_key(ctx.key).address if ctx.key else None)
    if not payee:
        raise ConfigError("--price needs --pay-to (or --key, whose account is then paid)")
    install_multicall(w3)
    paywall = Paywall(LocalFacilitator(ctx.rpc_url, load_key(settler).key.hex()), coin, payee)
    return X402(paywall, amount, f"a completion from dtrain-job-{job_id}")


def run(
    ctx: Ctx,
    cfg: ServeConfig,
    verified: Callable[[], Verified],
    payment: X402 | None = None,
) -> None:
    """Listen at once (logged on stderr); load the model (`verified()`, then its engine) on a
    thread meanwhile, calls being answered HTTP 503 until it is ready; announce it on stdout
    once ready (the line a script waits for, as before); serve until Ctrl-C or SIGTERM. A model
    that fails to load stops the server: its error (one line) is raised."""
    from dtrain_node.serve.loading import Loading

    sock = listen(cfg.host, cfg.port)
    port = sock.getsockname()[1]
    base = f"http://{url_host(cfg.host)}:{port}"
    url = base + "/v1"
    gate = Loading(cfg.model_id)
    server = uvicorn_server(gate)
    _log_requests()
    logging.getLogger("dtrain.serve").info(
        "%s: listening at %s while the model loads (calls are answered HTTP 503 until it is "
        "ready; GET %s/health says when)",
        cfg.model_id,
        url,
        base,
    )
    failure: list[BaseException] = []
    terms = None if payment is None else payment.terms()

    def load() -> None:
        try:
            app = loaded_app(cfg, verified, payment)
        except BaseException as exc:
            failure.append(load_error(cfg, exc))
            gate.failed(str(failure[0]))
            server.should_exit = True
            return
        gate.ready(app)
        _announce(ctx, cfg, url, payment, terms)

    threading.Thread(target=load, name="dtrain-serve-load", daemon=True).start()
    with sock:
        server.run(sockets=[sock])
    if failure:
        raise failure[0]
    emit(ctx, {"stopped": True}, "stopped serving")


def _announce(ctx: Ctx, cfg: ServeConfig, url: str, payment: X402 | None, terms: Any) -> None:
    """The line a script waits for on stdout: the model is loaded and answers at `url`."""
    from dtrain_node.serve.engine import TransformersEngine, engine_note

    emit(
        ctx,
        {
            "job_id": cfg.job_id,
            "model": cfg.model_id,
            "checkpoint": cfg.checkpoint.hex(),
            "engine": TransformersEngine.name,
            "url": url,
            "listening": True,
            "price": terms,
        },
        f"serving {cfg.model_id} (checkpoint 0x{cfg.checkpoint.hex()[:16]}.., engine "
        f"{engine_note()}) at {url}: listening until Ctrl-C"
        + ("" if payment is None else f"; {payment.note()}"),
    )
    sys.stdout.flush()


def loaded_app(
    cfg: ServeConfig, verified: Callable[[], Verified], payment: X402 | None = None
) -> Any:
    """The API over the model `verified()` gives, loaded into its engine."""
    from transformers.utils import logging as hf_logging

    from dtrain_node.serve.app import create_app
    from dtrain_node.serve.engine import TransformersEngine

    hf_logging.set_verbosity_error()  # not a warning per prompt longer than the context
    model = verified()
    return create_app(TransformersEngine(model.folder, model.model), cfg, payment)


def load_error(cfg: ServeConfig, exc: BaseException) -> DtrainError:
    """`exc`, raised loading the model, as one typed line (an SDK error keeps its own)."""
    from dtrain_node.serve.loading import ModelLoadFailed, one_line

    if isinstance(exc, DtrainError):
        return exc
    error = ModelLoadFailed(f"cannot load the model of job {cfg.job_id}: {one_line(exc)}")
    error.__cause__ = exc  # what `--debug` shows
    return error


def serve_until_signal(app: object, sock: socket.socket) -> None:
    """Serve `app` on `sock` until Ctrl-C or SIGTERM (`uvicorn_server`)."""
    uvicorn_server(app).run(sockets=[sock])


def uvicorn_server(app: object) -> uvicorn.Server:
    """A server of `app` that stops on Ctrl-C or SIGTERM (or once `should_exit` is set): calls
    in flight get GRACE_S to finish (a second Ctrl-C cuts them short). Unlike uvicorn's own,
    the signal is not raised again once stopped, so the command ends normally."""
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
    return Server(config)


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
