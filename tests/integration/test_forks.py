"""The devnet's fork server: a forked node is a process of its own, as a fresh interpreter
would be, and its exit status, signals and streams reach the caller as `Popen`'s do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from harness import harness_env

from dtrain_node.devnet import forks

PROBE = [sys.executable, "-m", "harness.fork_probe", "an", "arg"]


def _start(tmp_path, **env: str) -> tuple[forks.Forked, dict]:
    with (tmp_path / "err.log").open("w") as err:
        p = forks.popen(PROBE, harness_env(**env), subprocess.PIPE, subprocess.PIPE, err)
    assert isinstance(p, forks.Forked), "DTRAIN_FORKS=0 in the environment?"
    assert p.stdout is not None
    return p, json.loads(p.stdout.readline())


def test_a_forked_child_is_its_own_session_with_its_own_env_args_and_randomness(tmp_path) -> None:
    a, seen_a = _start(tmp_path, PROBE="one", OMP_NUM_THREADS="1")
    b, seen_b = _start(tmp_path, PROBE="two")
    assert seen_a["pid"] == a.pid and seen_a["sid"] == a.pid != os.getsid(0)
    assert (seen_a["probe"], seen_b["probe"]) == ("one", "two")
    assert seen_a["argv"] == ["an", "arg"] and seen_a["cwd"] == os.getcwd()
    assert seen_a["threads"] == 1
    assert seen_a["sigpipe_ignored"], "a write to a closed socket must raise, not kill"
    assert seen_a["draw"] != seen_b["draw"], "numpy's global random state is not shared"
    for p, code in ((a, 3), (b, 0)):
        assert p.poll() is None
        p.stdin.write(f"{code}\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == code
    assert "stderr line" in (tmp_path / "err.log").read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_signal_to_its_group_ends_it_as_it_would_a_fresh_interpreter(tmp_path, sig) -> None:
    p, _ = _start(tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.2)
    os.killpg(p.pid, sig)
    assert p.wait(timeout=30) == -sig


def test_nice_applies_to_the_child_only(tmp_path) -> None:
    with (tmp_path / "err.log").open("w") as err:
        p = forks.popen(
            ["nice", "-n", "5", *PROBE], harness_env(), subprocess.PIPE, subprocess.PIPE, err
        )
    seen = json.loads(p.stdout.readline())
    assert seen["nice"] == os.nice(0) + 5
    p.kill()
    assert p.wait(timeout=30) == -signal.SIGKILL


def test_without_the_server_it_is_a_plain_popen(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DTRAIN_FORKS", "0")
    with (tmp_path / "err.log").open("w") as err:
        p = forks.popen(PROBE, harness_env(PROBE="x"), subprocess.PIPE, subprocess.PIPE, err)
    assert isinstance(p, subprocess.Popen)
    seen = json.loads(p.stdout.readline())
    assert seen["probe"] == "x" and seen["sid"] == p.pid
    p.stdin.write("4\n")
    p.stdin.flush()
    assert p.wait(timeout=60) == 4


def test_children_die_with_the_server(tmp_path) -> None:
    """The server's client went away (its stdin closed): every child it still has is killed
    and reaped before it exits, and a caller waiting on one learns that the server is gone."""
    server = forks.ForkServer(preload=("numpy",))
    with (tmp_path / "err.log").open("w") as err, open(os.devnull) as null:
        p = server.spawn(
            "harness.fork_probe", [], harness_env(), (null.fileno(), err.fileno(), err.fileno())
        )
    assert os.path.exists(f"/proc/{p.pid}")
    server.close()
    assert not os.path.exists(f"/proc/{p.pid}")
    with pytest.raises(forks.ForkServerGone):
        p.wait(timeout=30)
