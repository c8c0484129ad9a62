"""`job submit` (and its `--dry-run`) against a real anvil: the estimate of the job's time and
cost in its summary, the recipe's schedule over the job's inner steps, and one validation of
the recipe's inner-step fields shared with `data check`."""

from __future__ import annotations

import json

import pytest
from harness.chain import ETH, advance, peer_key

from dtrain.client import BSM
from dtrain.models import Params
from dtrain.units import format_span


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text("def f(x):\n    return x + 1\n" * 50)
    return str(path)


@pytest.fixture(scope="module")
def windows(chain, accounts) -> BSM:
    """A deployment with a seat draw and a challenge window (the session's has neither)."""
    params = Params(
        treasury=accounts[10].address,
        developer=accounts[11].address,
        min_stake=ETH,
        start_grace=45,
        reveal_window=600,
        challenge_window=300,
        seat_draw_window=120,
    )
    return BSM.deploy(chain.url, accounts[0].key, params)


SUBMIT = ["job", "submit", "--operators", "2:4", "--epochs", "3", "--steps", "10"]
SUBMIT += ["--sync", "5", "--price", "0.01ether", "--epoch-duration", "2h"]


def test_dry_run_and_submit_print_the_time_and_cost_estimate(
    chain, run, bsm, windows, accounts, data, capsys
) -> None:
    """Each epoch is bounded by start grace + epoch duration + reveal window + challenge
    window, after the seat draw; the cost lies between the minimum members' pay and the
    escrow; the summary says what the estimate is based on. The real submit prints the same."""
    from dtrain.cli import main

    caller = accounts[4]

    def on_windows(*args: str) -> tuple[int, str, str]:
        argv = ["--rpc-url", chain.url, "--contract", windows.address, "--key", caller.key]
        code = main([*argv, *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    args = [*SUBMIT, "--dataset-uri", data]
    code, out, err = on_windows("--json", *args, "--dry-run")
    assert code == 0, err
    est = json.loads(out)["estimate"]
    per_epoch = 45 + 2 * 3600 + 600 + 300
    assert (est["seat_draw"], est["per_epoch"]) == (120, per_epoch)
    assert est["time_bound"] == 120 + 3 * per_epoch
    assert (est["cost_max"], est["cost_min"]) == (12 * ETH // 100, 6 * ETH // 100)
    assert est["cost_max"] == json.loads(out)["escrow"]

    code, out, err = on_windows(*args, "--dry-run")
    assert code == 0, err
    assert (
        f"  time     at most {format_span(120 + 3 * per_epoch)} once 2 operators applied: "
        f"seat draw 2 min, then 3 epoch(s) x at most {format_span(per_epoch)} (start grace "
        "45 s + epoch 2 h + reveals 10 min + challenge window 5 min)\n"
    ) in out
    assert (
        "  cost     at most 0.12 ETH (the escrow); 0.06 ETH if 2 operators serve every epoch "
        "(the rest refunded)\n"
    ) in out
    assert "operators announce no training speed" in out

    code, out, err = on_windows("--json", *args)  # the real submit: the same estimate
    assert code == 0, err
    assert json.loads(out)["estimate"] == est

    # The session's deployment: no seat draw and no challenge window, so neither is counted.
    code, out, err = run(*args, key=caller.key)
    assert code == 0, err
    per_epoch = 30 + 2 * 3600 + 600
    assert f"  time     at most {format_span(3 * per_epoch)} once 2 operators applied: 3 " in out
    assert "(start grace 30 s + epoch 2 h + reveals 10 min)\n" in out
    time_line = next(x for x in out.splitlines() if x.startswith("  time "))
    assert "seat draw" not in time_line and "challenge" not in time_line


def test_a_model_trained_here_before_gets_a_typical_time_at_its_measured_speed(
    chain, accounts, data, votes, capsys
) -> None:
    """On a fresh deployment a first job of the model runs one epoch of 10 inner steps whose
    two members commit 100 s (chain time) after it started: 10 s per step. A job of the same
    model with 3 epochs of 20 steps is then estimated at about 3 x (200 s + the 5 min challenge
    window) beside its bound, and the summary says what that rests on."""
    from dtrain.cli import main

    params = Params(treasury=accounts[10].address, developer=accounts[11].address,
                    min_stake=ETH, challenge_window=300, seat_draw_window=0)  # fmt: skip
    bsm = BSM.deploy(chain.url, accounts[0].key, params)

    def submit(*args: str) -> dict:
        argv = ["--rpc-url", chain.url, "--contract", bsm.address, "--key", accounts[4].key]
        common = ["--operators", "2:2", "--sync", "5", "--price", "0.01ether"]
        code = main([*argv, "--json", "job", "submit", *common, "--dataset-uri", data, *args])
        out, err = capsys.readouterr()
        assert code == 0, err
        return json.loads(out)

    first = submit("--epochs", "1", "--steps", "10", "--epoch-duration", "2h")
    assert first["estimate"]["typical"] is None  # nothing trained here yet
    job_id = bsm.next_job_id() - 1
    ops = [bsm.with_account(accounts[i].key) for i in (1, 2)]
    for i, op in enumerate(ops):
        op.register_operator(ETH, peer_key(i), [], "cpu", 0)
        op.join_job(job_id)
    assert bsm.job(job_id).state.status.name == "RUNNING"
    advance(bsm.w3, 100)
    for op in ops:
        votes.commit(op, job_id, 0, b"\x01" * 32, [10, 10])

    est = submit("--epochs", "3", "--steps", "20", "--epoch-duration", "2h", "--dry-run")
    est = est["estimate"]
    assert est["measured_epochs"] == 1 and est["step_s"] == pytest.approx(10.0, abs=0.3)
    assert est["typical"] == 3 * (round(20 * est["step_s"]) + 300)
    assert est["time_bound"] == 3 * (30 + 2 * 3600 + 600 + 300)  # the bound, unchanged
    argv = ["--rpc-url", chain.url, "--contract", bsm.address, "--key", accounts[4].key]
    code = main([*argv, "job", "submit", "--operators", "2:2", "--sync", "5", "--price",
                 "0.01ether", "--dataset-uri", data, "--epochs", "3", "--steps", "20",
                 "--epoch-duration", "2h", "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert f"  typical  about {format_span(est['typical'])} once 2 operators applied" in out
    assert "s per inner step, the median of 1 epoch(s))" in out


def test_a_token_job_is_estimated_in_its_token(run, bsm, accounts, data) -> None:
    from dtrain.devtoken import UNIT, TestUSD

    caller = accounts[4]
    usd = TestUSD.deploy(bsm.w3, accounts[0].key)
    usd.mint(caller.address, 10 * UNIT)
    bsm.with_account(accounts[11].key).set_payment_token(usd.address)
    tok = [a if a != "0.01ether" else "0.5" for a in SUBMIT]
    tok += ["--dataset-uri", data, "--token", usd.address, "--dry-run"]
    code, out, err = run(*tok, key=caller.key)
    assert code == 0, err
    assert "  cost     at most 6 TUSD (the escrow); 3 TUSD if 2 operators serve every epoch" in out


def test_the_summary_shows_the_recipes_schedule_over_the_job(
    run, bsm, accounts, data, tmp_path
) -> None:
    """A recipe with a schedule is summarised over the job's epochs x steps; a warm-up longer
    than the job says how far the rate gets. A recipe without one adds no line."""
    path = tmp_path / "recipe.toml"
    path.write_text('lr_schedule = "cosine"\nwarmup_steps = 40\nmax_grad_norm = 1.0\n')
    args = [*SUBMIT, "--dataset-uri", data, "--recipe", str(path), "--dry-run"]
    code, out, err = run(*args, key=accounts[4].key)
    assert code == 0, err
    assert (
        "  schedule cosine inner lr over 30 inner steps (3 epoch(s) x 10), after 40 warm-up "
        "steps; the warm-up is longer than the job, so the rate peaks at 30/40 of inner_lr 0.002"
    ) in out
    path.write_text('lr_schedule = "linear"\nwarmup_steps = 5\n')
    code, out, err = run(*args, key=accounts[4].key)
    assert code == 0, err
    assert "  schedule linear inner lr over 30 inner steps (3 epoch(s) x 10), after 5 " in out
    assert "longer than the job" not in out
    path.write_text("grad_accum = 2\n")
    code, out, err = run(*args, key=accounts[4].key)
    assert code == 0 and "schedule" not in out, err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('lr_schedule = "step"', "recipe field 'lr_schedule' must be constant, linear or cosine"),
        ("warmup_steps = -5", "recipe field 'warmup_steps' must be >= 0"),
        ("min_lr_ratio = 0.5", "recipe field 'min_lr_ratio' applies to lr_schedule 'linear'"),
        ("max_grad_norm = -1", "recipe field 'max_grad_norm' must be >= 0"),
        ("grad_accum = 0", "recipe field 'grad_accum' must be >= 1"),
    ],
)
def test_data_check_and_submit_refuse_a_bad_field_alike(
    run, bsm, accounts, data, tmp_path, line, message
) -> None:
    """One validation: `data check --recipe` and `job submit --recipe` (dry run or not) refuse
    the same bad field with the same one-line error, and nothing is sent."""
    path = tmp_path / "recipe.toml"
    path.write_text(line + "\n")
    before = bsm.next_job_id()
    errors = []
    for args in (
        ["data", "check", data, "--method", "cpt", "--recipe", str(path)],
        [*SUBMIT, "--dataset-uri", data, "--recipe", str(path), "--dry-run"],
        [*SUBMIT, "--dataset-uri", data, "--recipe", str(path)],
    ):
        code, _, err = run(*args, key=accounts[4].key)
        assert code == 1 and message in err and err.count("\n") == 1, err
        errors.append(err)
    assert errors[0] == errors[1] == errors[2]
    assert bsm.next_job_id() == before
