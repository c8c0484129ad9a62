"""The operator's terminal: the progress line, readable events, the plain (non-tty) log format
with one timestamp per line, and what each signal says."""

from __future__ import annotations

import logging
import re
import time
from types import SimpleNamespace

import pytest

from dtrain.models import JobStatus
from dtrain_node.operator.cli import terminal
from dtrain_node.operator.progress import (
    Status,
    describe,
    first_signal_message,
    progress_line,
    second_signal_message,
)

ME = "0x" + "11" * 20
ROUND = {
    "job": 7,
    "epoch": 1,
    "round": 4,
    "peers": 2,
    "loss": 3.21049,
    "tokens_per_s": 1234.5,
    "applied": 3,
    "compute_s": 1.5,
    "sync_s": 0.5,
    "attempt": 9,
}


def job(now: float) -> SimpleNamespace:
    spec = SimpleNamespace(total_epochs=3, steps_per_epoch=60, sync_interval=2)
    state = SimpleNamespace(epoch=1, attempt=9, status=JobStatus.RUNNING)
    return SimpleNamespace(
        id=7,
        spec=spec,
        state=state,
        deadline=int(now) + 242,
        reveal_deadline=int(now) + 542,
        members=(ME, "0x" + "22" * 20, "0x" + "33" * 20),
        pending_joins=(),
    )


def training(now: float) -> Status:
    s = Status(state="TRAIN", dropout_bps=500, pool=10**18)
    s.observe(job(now), ME)
    s.on_round(ROUND)
    return s


def test_progress_line_has_every_field() -> None:
    now = float(int(time.time()))
    line = progress_line(training(now), now)
    assert line.split(" | ") == [
        "TRAIN   ",
        "job 7",
        "epoch 1 (epochs 0..2)",  # the second of three
        "round 5/30",
        "loss 3.2105",
        "1234 tok/s",
        "ETA 50s",  # 25 rounds left at 2 s
        "commit deadline in 4m02s",
        "peers 2/2",
    ]
    assert "attempt" not in line and "9" not in line.split("|")[2]


def test_a_lost_epoch_says_why_in_the_progress_line_until_the_next_epoch() -> None:
    now = float(int(time.time()))
    s = training(now)
    s.lost = "6 rounds left at 8.0 s of training each need 84 s, the commit deadline is in 60 s"
    line = progress_line(s, now)
    assert line.split(" | ")[3:] == [
        "round 5/30",
        f"epoch lost ({s.lost}): not voting it, leaving at its end",
    ]
    s.state = "FINALIZE"
    assert "epoch lost" in progress_line(s, now)
    nxt = job(now)
    nxt.state.epoch = 2
    s.observe(nxt, ME)
    assert not s.lost and "epoch lost" not in progress_line(s, now)


def test_a_grpo_round_shows_its_mean_reward_next_to_the_loss() -> None:
    """A GRPO loss near 0 says nothing of what the policy learns: the round's mean reward
    is shown beside it (and only for a round that has one)."""
    now = float(int(time.time()))
    s = training(now)
    s.on_round({**ROUND, "loss": 0.0009, "reward": 1.4e-9})
    parts = progress_line(s, now).split(" | ")
    assert parts[4:6] == ["loss 0.0009", "reward 0.0000"]
    s.on_round({**ROUND, "round": 5})
    assert not any(p.startswith("reward") for p in progress_line(s, now).split(" | "))


def test_events_read_well_and_hide_the_job_wide_attempt() -> None:
    now = time.time()
    s = training(now)
    s.retry = 1
    start = {"job": 7, "epoch": 1, "attempt": 9, "members": 3, "shard": 100, "first_round": 0}
    assert describe("epoch_start", start, s) == (
        "epoch 1 (epochs 0..2) (retry 1) of job 7 started: 3 members, shard of 100"
    )
    assert "attempt" not in describe("resumed", {"job": 7, "attempt": 9, "round": 3}, s)
    assert describe("withdrew", {"amount": 5 * 10**16}, s) == "withdrew 0.05 ETH"
    token = {"amount": 6000, "token": "0xe7f1", "text": "0.006 TUSD"}
    assert describe("withdrew", token, s) == "withdrew 0.006 TUSD"
    assert describe("round", ROUND, s).startswith(
        "TRAIN    | job 7 | epoch 1 (epochs 0..2) (retry 1) | round 5/30"
    )


def test_plain_output_one_timestamp_per_line(tmp_path, capsys) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        live = terminal(tmp_path, tty=False)
        with live(Status()):
            log = logging.getLogger("dtrain.node")
            log.info(describe("round", ROUND, training(time.time())), extra={"progress": True})
            log.warning("SIGINT: leaving after this epoch")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    epoch = re.escape("epoch 1 (epochs 0..2)")
    assert re.match(rf"^{stamp} INFO    TRAIN    \| job 7 \| {epoch} \| round 5/30 \|", err[0])
    assert re.match(rf"^{stamp} WARNING SIGINT: leaving after this epoch$", err[1])
    assert all(len(re.findall(r"\d\d:\d\d:\d\d", x)) == 1 for x in err)
    assert "round 5/30" in (tmp_path / "node.log").read_text()  # the file gets it too


def test_rich_handler_prints_its_own_time_only(tmp_path) -> None:
    from rich.logging import RichHandler

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        terminal(tmp_path, tty=True)
        [rich] = [h for h in root.handlers if isinstance(h, RichHandler)]
        assert rich.formatter._fmt == "%(message)s"  # no asctime beside rich's own time
        progress = logging.makeLogRecord({"msg": "round", "progress": True})
        assert not rich.filter(progress)  # rounds go to the live line instead
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


@pytest.mark.parametrize(
    ("state", "first", "second"),
    [
        ("REGISTER", "leaving after registering", "nothing at stake"),
        ("WAIT", "give our seat and its bond back at once", "we hold a seat in job 7"),
        (
            "TRAIN",
            "leaving after this epoch: job 7 keeps our seat until the end of epoch 1 (epochs 0..2)",
            "we are a member of epoch 1 (epochs 0..2) of job 7; if we do not commit by",
        ),
        ("DONE", "no longer serving its final checkpoint", "nothing at stake"),
    ],
)
def test_signal_messages(state: str, first: str, second: str) -> None:
    now = time.time()
    s = training(now)
    s.state = state
    if state == "WAIT":
        s.running = False
    assert first in first_signal_message(s)
    assert second in second_signal_message(s, now)
    if state == "TRAIN":
        assert "slashed 5% of our pool (0.05 ETH of 1 ETH) for dropout" in (
            second_signal_message(s, now)
        )


def test_second_signal_after_committing_names_the_withheld_reveal_rate() -> None:
    now = time.time()
    s = training(now)
    s.state, s.committed, s.withheld_bps = "REVEAL", True, 1000
    msg = second_signal_message(s, now)
    assert "if we do not reveal by" in msg
    assert "slashed 10% of our pool (0.1 ETH of 1 ETH) for a withheld reveal" in msg


def test_libp2p_errors_go_to_the_log_file_timestamped_not_bare_to_stderr(tmp_path, capsys) -> None:
    """libp2p logs a failed dial (a watcher that left) at ERROR on a logger that does not
    propagate: without a handler of its own Python printed it on stderr with no timestamp."""
    import libp2p  # noqa: F401 - its import configures its logger

    root, lib = logging.getLogger(), logging.getLogger("libp2p")
    saved = root.handlers[:], root.level, lib.handlers[:], lib.level
    try:
        terminal(tmp_path, tty=False)
        logging.getLogger("libp2p.transport.tcp.tcp").error("Failed to open TCP stream: gone")
    finally:
        root.handlers[:], lib.handlers[:] = saved[0], saved[2]
        root.setLevel(saved[1])
        lib.setLevel(saved[3])
    assert "Failed to open TCP stream" not in capsys.readouterr().err
    (line,) = [x for x in (tmp_path / "node.log").read_text().splitlines() if "TCP stream" in x]
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line), line
