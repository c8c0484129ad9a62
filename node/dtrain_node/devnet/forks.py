"""Cheap starts for a devnet's processes: a server imports what an operator node imports once
(torch, transformers' Llama, web3, libp2p: about 9 s of CPU per interpreter) and forks every
node from that state. Each node is still its own OS process in its own session, running
`python -m MODULE ARGS` from the same code as a fresh interpreter would; only the imported
modules are shared, copy-on-write. `DTRAIN_FORKS=0` starts fresh interpreters instead.

The server is single-threaded and never runs a tensor operation before it forks (a forked
child of a process with live OpenMP or Python threads can deadlock). Requests travel over a
unix SOCK_SEQPACKET socket with the child's stdin, stdout and stderr as passed descriptors; the
child's exit status comes back on the same connection, as `Popen.returncode` would be
(negative: killed by that signal). The server kills every child it still has and exits when
the process that started it closes its stdin."""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

PRELOAD = (
    "numpy",
    "torch",
    "transformers.models.llama.modeling_llama",
    "dtrain.cli",
    "dtrain_node.operator.node",
    "dtrain_node.operator.referee_service",
)
_MAX_REQUEST = 1 << 20
_SERVER = "import sys; from dtrain_node.devnet.forks import serve; serve(sys.argv[1], sys.argv[2:])"


class ForkServerGone(RuntimeError):
    """The fork server exited: its children's exit statuses are unknown."""


class Forked:
    """A child of the fork server, with the part of `subprocess.Popen` the devnet uses."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str]) -> None:
        self._conn = conn
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self.stdin: IO[str] | None = None
        self.stdout: IO[str] | None = None

    def _read(self, timeout: float | None) -> None:
        self._conn.settimeout(timeout)
        msg = self._conn.recv(256)
        if not msg:
            raise ForkServerGone(f"fork server gone while {self.pid} ran")
        self.returncode = int(json.loads(msg)["exit"])
        self._conn.close()

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(BlockingIOError, TimeoutError):
                self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self._read(timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The client side: starts the server (`serve` in a fresh interpreter) and asks it
    for children."""

    def __init__(self, preload: Sequence[str] = PRELOAD) -> None:
        self._dir = tempfile.mkdtemp(prefix="dtrain-forks-")
        self.path = os.path.join(self._dir, "s")
        threads = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # each child sets its own
        env = {k: v for k, v in os.environ.items() if k not in threads}
        self._server = subprocess.Popen(
            [sys.executable, "-c", _SERVER, self.path, *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._server.stdout is not None
        if self._server.stdout.readline().strip() != "ready":
            self._server.kill()
            raise ForkServerGone(f"fork server failed to start (exit {self._server.wait()})")

    def spawn(
        self,
        module: str,
        args: Sequence[str],
        env: Mapping[str, str],
        stdio: tuple[int, int, int],
        cwd: str | None = None,
        nice: int = 0,
    ) -> Forked:
        """`python -m module *args` in a new session with `env` and `stdio` (descriptors for
        its stdin, stdout and stderr, which the caller may close afterwards)."""
        req = {"module": module, "args": list(args), "env": dict(env), "cwd": cwd or os.getcwd()}
        req["nice"] = nice
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(self.path)
        socket.send_fds(conn, [json.dumps(req).encode()], list(stdio))
        msg = conn.recv(256)
        if not msg:
            conn.close()
            raise ForkServerGone("fork server gone before it forked")
        return Forked(conn, int(json.loads(msg)["pid"]), [sys.executable, "-m", module, *args])

    def close(self) -> None:
        if self._server.poll() is None:
            assert self._server.stdin is not None
            self._server.stdin.close()
            try:
                self._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self._dir)


_shared: ForkServer | None = None
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("DTRAIN_FORKS", "1") != "0"


def shared() -> ForkServer:
    """This process's fork server, started on first use and closed at exit."""
    global _shared
    with _lock:
        if _shared is None or _shared._server.poll() is not None:
            _shared = ForkServer()
            atexit.register(_shared.close)
        return _shared


def popen(
    cmd: Sequence[str],
    env: Mapping[str, str],
    stdin: int | IO[Any] | None,
    stdout: int | IO[Any] | None,
    stderr: int | IO[Any] | None,
) -> Forked | subprocess.Popen:
    """`subprocess.Popen(cmd, ..., start_new_session=True)` for `cmd` = [sys.executable, "-m",
    MODULE, *ARGS] (or with a `nice -n N` in front), forked from the shared server unless
    `DTRAIN_FORKS=0`. Streams: file objects, descriptors, `subprocess.PIPE` for stdin and
    stdout (text, line-buffered), or None (/dev/null for stdin, this process's own else)."""
    nice, argv = 0, list(cmd)
    if argv[:2] == ["nice", "-n"]:
        nice, argv = int(argv[2]), argv[3:]
    if not (enabled() and len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m"):
        return subprocess.Popen(
            list(cmd),
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=dict(env),
            text=True,
            start_new_session=True,
        )
    mine: list[int] = []  # our ends of the pipes
    theirs: list[int] = []  # descriptors we open for the child and close once it has them
    fds = []
    for s, default in ((stdin, None), (stdout, 1), (stderr, 2)):
        if s == subprocess.PIPE:
            r, w = os.pipe()
            child, ours = (r, w) if default is None else (w, r)
            mine.append(ours)
            theirs.append(child)
            fds.append(child)
        elif isinstance(s, int):
            fds.append(s)
        elif s is not None:
            fds.append(s.fileno())
        elif default is None:
            fds.append(os.open(os.devnull, os.O_RDONLY))
            theirs.append(fds[-1])
        else:
            fds.append(default)
    try:
        p = shared().spawn(argv[2], argv[3:], env, (fds[0], fds[1], fds[2]), nice=nice)
    finally:
        for fd in theirs:
            os.close(fd)
    if stdin == subprocess.PIPE:
        p.stdin = open(mine.pop(0), "w", buffering=1)  # noqa: SIM115 - the caller's to close
    if stdout == subprocess.PIPE:
        p.stdout = open(mine.pop(0), buffering=1)  # noqa: SIM115
    return p


# ------------------------------------------------------------------------------ the server


def _child(req: dict[str, Any], fds: list[int]) -> None:
    """Runs in the forked child: become `python -m module args` and exit with its status."""
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    if req["nice"]:
        os.nice(req["nice"])
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    for p in reversed(req["env"].get("PYTHONPATH", "").split(os.pathsep)):
        if p and p not in sys.path:
            sys.path.insert(0, p)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the child's own streams
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    _fresh_state(req["env"])
    sys.argv = [req["module"], *req["args"]]
    code = 0
    try:
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        _flush_and_exit_by(signal.SIGINT)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    _flush_and_exit(code)


def _fresh_state(env: Mapping[str, str]) -> None:
    """What a fresh interpreter would not share with its siblings: numpy's global random state
    (Python's own `random` reseeds itself at fork) and the thread count asked for."""
    import numpy as np
    import torch

    np.random.seed()
    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))


def _wind_down() -> None:
    """What a fresh interpreter does before it exits: atexit handlers, then flushed streams."""
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            s.flush()


def _flush_and_exit(code: int) -> None:
    _wind_down()
    os._exit(code & 0xFF)


def _flush_and_exit_by(sig: int) -> None:
    _wind_down()
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
            conn.close()


def _fork(
    conn: socket.socket, closing: list[socket.socket], children: dict[int, socket.socket]
) -> None:
    msg, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 3)
    if not msg or len(fds) != 3:
        conn.close()
        for fd in fds:
            os.close(fd)
        return
    req = json.loads(msg)
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            # as a fresh interpreter starts: SIGPIPE stays ignored (Python's own start-up
            # ignores it, so a write to a closed socket raises instead of killing)
            for sig in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for s in (*closing, *children.values()):
                s.close()
            _child(req, fds)
        finally:
            os._exit(70)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    conn.send(json.dumps({"pid": pid}).encode())


def serve(path: str, preload: Sequence[str]) -> None:
    for m in preload:
        importlib.import_module(m)
    # What was preloaded lives as long as every child: out of the collector's reach, a child's
    # full collection no longer walks (and so copies, page by page) the whole shared heap,
    # which cost ~0.4 s of CPU each time it ran in each child.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, wake_r, sys.stdin], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while wake_r.recv(4096):
                    pass
        _reap(children)
        if sys.stdin in ready and not sys.stdin.readline():
            break  # the client is gone: so are its children
        if listener in ready:
            conn, _ = listener.accept()
            _fork(conn, [listener, wake_r, wake_w, conn], children)
    for pid in children:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # its own children too
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)  # it may not have its own group yet
            os.waitpid(pid, 0)
    Path(path).unlink(missing_ok=True)
