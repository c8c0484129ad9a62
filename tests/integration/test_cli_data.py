"""`dtrain data check` and the dataset validation of `dtrain job submit`: a bad file is refused
with its line numbers before any transaction is sent."""

from __future__ import annotations

import json

import pytest

USER = {"role": "user", "content": "2+2="}
BOT = {"role": "assistant", "content": "4"}


def jsonl(path, lines: list[object]) -> str:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(path)


def chat(i: int) -> dict[str, object]:
    user = {"role": "user", "content": f"{i}+{i}="}
    return {"messages": [user, {"role": "assistant", "content": str(2 * i)}]}


@pytest.fixture
def good(tmp_path) -> str:
    """Ten distinct chat records: enough for a held-out split and training records."""
    return jsonl(tmp_path / "good.jsonl", [chat(i) for i in range(10)])


@pytest.fixture
def bad(tmp_path) -> str:
    return jsonl(
        tmp_path / "bad.jsonl",
        [{"messages": [USER, BOT]}, {"prompt": "2+2=", "complection": "4"}, "{oops"],
    )


def test_data_check_prints_a_summary_or_the_bad_lines(run, good, bad, tmp_path) -> None:
    code, out, err = run("data", "check", good, "--method", "sft")
    assert code == 0, err
    assert out.strip() == f"dataset  {good}  10 records (sft, messages)"
    code, out, err = run("--json", "data", "check", good, "--method", "sft")
    assert code == 0 and json.loads(out)["summary"] == "10 records (sft, messages)", err
    code, out, err = run("data", "check", bad, "--method", "sft")
    assert code == 1 and not out
    assert f"dataset {bad} line 2: unknown key 'complection' (did you mean 'completion'?)" in err
    assert f"dataset {bad} line 3: is not JSON" in err
    code, _, err = run("data", "check", good, "--method", "dpo")
    assert code == 1 and "line 1: a messages record: unknown key 'messages'" not in err
    assert "line 1: unknown key 'messages'" in err, err
    text = tmp_path / "corpus.txt"
    text.write_text("def f():\n    return 1\n" * 100)
    code, out, err = run("data", "check", str(text), "--method", "cpt")
    assert code == 0 and "1 document, 2,200 characters (cpt, text)" in out, err
    text.write_text("def f():\n    return 1\n")  # a valid file, too short for one sequence
    code, out, err = run("data", "check", str(text), "--method", "cpt")
    assert code == 1 and not out
    assert (
        err
        == f"error: this job could not train: dataset {text} of 22 bytes is too small for ctx 128\n"
    )


def test_data_check_reads_the_reward_from_the_recipe(run, tmp_path) -> None:
    sums = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(4)]
    data = jsonl(tmp_path / "g.jsonl", [*sums, {"prompt": "name?", "answer": "x"}])
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('reward = "numeric"\n')
    code, out, err = run("data", "check", data, "--method", "grpo")
    assert code == 0 and "5 records (grpo, text, reward exact)" in out, err
    code, _, err = run("data", "check", data, "--method", "grpo", "--recipe", str(recipe))
    assert code == 1 and "line 5: answer 'x' is not a number" in err, err


def test_submit_validates_the_dataset_before_any_transaction(
    run, bsm, accounts, good, bad, tmp_path
) -> None:
    before = bsm.next_job_id()
    code, out, err = run(
        "job", "submit", "--price", "1gwei", "--method", "sft", "--dataset-uri", bad,
        key=accounts[4].key,
    )  # fmt: skip
    assert code == 1 and not out
    assert f"dataset {bad} line 2: " in err and f"dataset {bad} line 3: " in err, err
    assert bsm.next_job_id() == before  # nothing created
    code, out, err = run(
        "job", "submit", "--price", "1gwei", "--method", "dpo", "--dataset-uri", good,
        key=accounts[4].key,
    )  # fmt: skip
    assert code == 1 and "line 1: unknown key 'messages'" in err, err
    assert bsm.next_job_id() == before
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('reward = "regex"\n')
    grpo = jsonl(tmp_path / "g.jsonl", [{"prompt": "p", "answer": "[0-9"}] * 2)
    code, _, err = run(
        "job", "submit", "--price", "1gwei", "--method", "grpo", "--dataset-uri", grpo,
        "--recipe", str(recipe), key=accounts[4].key,
    )  # fmt: skip
    assert code == 1 and "line 1: answer '[0-9' is not a valid regex" in err, err
    assert bsm.next_job_id() == before

    code, out, err = run(
        "job", "submit", "--price", "1gwei", "--method", "sft", "--dataset-uri", good,
        key=accounts[4].key,
    )  # fmt: skip
    assert code == 0, err
    assert "(sha256), 10 records (sft, messages)" in out
    assert bsm.next_job_id() == before + 1


def test_submit_with_a_given_hash_does_not_read_the_file(run, bsm, accounts, bad) -> None:
    """--dataset-hash pins a file only the operators have: nothing here is read or checked."""
    code, out, err = run(
        "--json", "job", "submit", "--price", "1gwei", "--method", "sft", "--dataset-uri", bad,
        "--dataset-hash", "0x" + "ab" * 32, key=accounts[4].key,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["dataset_summary"] == ""


def test_submit_dry_runs_the_job_the_recipe_must_fit_the_model(
    run, bsm, accounts, good, tmp_path
) -> None:
    """`job submit` builds the job as the nodes will: a recipe whose sequence length exceeds the
    model's context, or whose LoRA targets are not in the model, is refused before any
    transaction; a fitting one pins the same model hash `dtrain model hash` prints."""
    from dtrain_node.train.start import model_hash
    from dtrain_node.train.toy_models import save

    model = save("gpt2", tmp_path / "my-model")
    before = bsm.next_job_id()
    for text, why in [
        ("seq_len = 512\n", "recipe seq_len 512 exceeds the context"),
        ('lora_rank = 4\nlora_targets = "no_such_module"\n', "LoRA settings do not fit"),
    ]:
        recipe = tmp_path / "recipe.toml"
        recipe.write_text(text)
        code, out, err = run(
            "job", "submit", "--price", "1gwei", "--method", "sft", "--model", str(model),
            "--dataset", good, "--recipe", str(recipe), key=accounts[4].key,
        )  # fmt: skip
        assert code == 1 and not out and why in err, err
        assert bsm.next_job_id() == before
    recipe.write_text("seq_len = 64\nlora_rank = 4\n")
    code, out, err = run(
        "--json", "job", "submit", "--price", "1gwei", "--method", "sft", "--model", str(model),
        "--dataset", good, "--recipe", str(recipe), key=accounts[4].key,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["model_hash"] == "0x" + model_hash(str(model)).hex()
    assert bsm.next_job_id() == before + 1


@pytest.mark.parametrize(
    ("recipe_text", "answers", "why"),
    [
        ('backend = "trl"\n', ["4", "6", "8", "2"], "backend 'trl' trains sft and dpo"),
        ("", ["4", "6", "10", "2"], "GRPO answers must all have one width, got [1, 2]"),
    ],
)
def test_data_check_refuses_what_submit_refuses_with_the_same_line(
    run, bsm, accounts, tmp_path, recipe_text, answers, why
) -> None:
    """One validation: a GRPO recipe (or dataset) that `job submit` cannot train is refused by
    `data check` too, in the same words, instead of passing there and failing at submit."""
    data = jsonl(
        tmp_path / "g.jsonl",
        [{"prompt": f"q{i}=", "answer": a} for i, a in enumerate(answers)],
    )
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(recipe_text)
    code, out, check_err = run("data", "check", data, "--method", "grpo", "--recipe", str(recipe))
    assert code == 1 and not out and why in check_err, check_err
    before = bsm.next_job_id()
    code, out, submit_err = run(
        "job", "submit", "--price", "1gwei", "--method", "grpo", "--dataset-uri", data,
        "--recipe", str(recipe), "--dry-run", key=accounts[4].key,
    )  # fmt: skip
    assert code == 1 and not out
    assert submit_err == check_err
    assert bsm.next_job_id() == before
