"""Offline task generators, the files they write, and the held-out split (validation of any
dataset file: test_dataset.py)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest
from harness.jobs import tiny_job

from dtrain_node.errors import DatasetError
from dtrain_node.train import tasks
from dtrain_node.train.backend import make_backend
from dtrain_node.train.dataset import prompt_key


def test_addition_answers_are_correct_distinct_and_bounded():
    probs = tasks.addition(500, digits=2, seed=3)
    assert len(probs) == 500 and len({p.prompt for p in probs}) == 500
    for p in probs:
        a, b = p.prompt.removesuffix("=").split("+")
        assert p.answer == str(int(a) + int(b))
    small = tasks.addition(1000, digits=1, max_sum=9)
    assert len(small) == 55  # pairs of digits with a + b <= 9
    assert all(len(p.answer) == 1 for p in small)


def test_addition_is_deterministic_from_seed():
    assert tasks.addition(50, 2, seed=1) == tasks.addition(50, 2, seed=1)
    assert tasks.addition(50, 2, seed=1) != tasks.addition(50, 2, seed=2)


def test_reversal_and_last_letter_answers():
    for p in tasks.reversal(50, length=5, seed=0):
        s = p.prompt.removeprefix("rev ").removesuffix(":")
        assert len(s) == 5 and p.answer == s[::-1]
    for p in tasks.last_letter(50, length=4, seed=0):
        s = p.prompt.removeprefix("last ").removesuffix(":")
        assert p.answer == s[-1]


@pytest.mark.parametrize("gen", [tasks.reversal, tasks.last_letter])
def test_string_tasks_are_distinct_capped_and_seeded(gen):
    probs = gen(1000, length=3, seed=0)
    assert len(probs) == 6**3 == len({p.prompt for p in probs})  # every string once, no more
    assert len({p.prompt for p in gen(1000, length=4, seed=0)}) == 1000
    assert gen(50, length=4, seed=1) == gen(50, length=4, seed=1) != gen(50, length=4, seed=2)
    with pytest.raises(ValueError):
        gen(5, length=3, alphabet="aa")


# The datasets of the unit tests, the benchmarks and the devnet (before: 99 of 100 held-out DPO
# prompts and 50 of 100 GRPO prompts of the benchmark sets were also training prompts).
DATASETS = {
    "sft": lambda: tasks.addition(1000, digits=2, seed=0),
    "dpo": lambda: tasks.reversal(1000, length=3, seed=0),
    "grpo": lambda: tasks.last_letter(1000, length=4, seed=0),
}


@pytest.mark.parametrize("method", sorted(DATASETS))
def test_generated_heldout_prompts_are_never_trained_on(method):
    train, held = tasks.split(tasks.records(DATASETS[method](), method, seed=0))
    assert held and train
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}


def test_split_keeps_a_repeated_prompt_on_one_side():
    # A caller's dataset may repeat prompts (several pairs per prompt): all of a held-out
    # prompt's records are held out, wherever they are in the file; nothing is dropped.
    recs = [{"prompt": f"p{i % 7}", "completion": str(i)} for i in range(30)]
    train, held = tasks.split(recs)
    assert held[-1] == recs[-1]
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert sorted(map(str, train + held)) == sorted(map(str, recs))
    # 3 to hold out; the last record's prompt p1 has 5 records, so its group alone is enough
    assert held == [r for r in recs if r["prompt"] == "p1"] and len(held) == 5
    with pytest.raises(DatasetError, match="no training records"):
        tasks.split([{"prompt": "same", "completion": str(i)} for i in range(10)])


def old_split(recs, fraction=0.1):
    """The split before the cap (every prompt of the last fraction of records, all of their
    records): what jobs on datasets without repeated prompts were started with."""
    n = max(1, int(len(recs) * fraction))
    held = {prompt_key(r["prompt"]) for r in recs[-n:]}
    train = [r for r in recs[:-n] if prompt_key(r["prompt"]) not in held]
    return train, [r for r in recs if prompt_key(r["prompt"]) in held]


@pytest.mark.parametrize("order", ["round robin", "shuffled", "blocks"])
def test_split_of_repeated_prompts_holds_out_at_most_one_group_over_the_fraction(order):
    """300 records over 40 prompts at fraction 0.1: the held-out split was 230 records (round
    robin) or 150 (shuffled), 35 in blocks; now 30 <= held < 30 + one group, the same every call."""
    import random

    recs = [{"prompt": f"q{i % 40}", "completion": str(i)} for i in range(300)]
    if order == "shuffled":
        random.Random(0).shuffle(recs)
    elif order == "blocks":
        recs.sort(key=lambda r: int(r["prompt"][1:]))
    groups = Counter(r["prompt"] for r in recs)
    train, held = tasks.split(recs, 0.1)
    assert len(old_split(recs)[1]) == {"round robin": 230, "shuffled": 150, "blocks": 35}[order]
    last = recs[-1]["prompt"]
    assert held[-1] == recs[-1] and 30 <= len(held) < 30 + max(groups.values())
    assert len(held) <= 30 + groups[last]
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert sorted(map(str, train + held)) == sorted(map(str, recs))
    assert [r for r in recs if r in train] == train and [r for r in recs if r in held] == held
    assert tasks.split([dict(r) for r in recs], 0.1) == (train, held)


def test_split_of_unique_prompts_is_unchanged():
    """Running jobs depend on it: datasets without repeated prompts split exactly as before
    the cap (the last fraction of records), pinned by hash and against the old rule."""
    for method, want in [
        ("sft", "398242afbacc06cff7336c1d4819f3b35fed44aba41c58865f9c19ac6ec9c7e8"),
        ("grpo", "2222aed5be96e6bde9f4e4a96a9266cd961cffb39ca32932be5de21de3ac7b8f"),
    ]:
        recs = tasks.records(tasks.last_letter(200, length=4, seed=0), method, 0)
        train, held = tasks.split(recs, 0.1)
        assert (len(train), len(held)) == (180, 20)
        got = hashlib.sha256(json.dumps([train, held], sort_keys=True).encode()).hexdigest()
        assert got == want
    chats = [[{"role": "user", "content": f"c{i}"}] for i in range(17)]
    for n in (2, 3, 10, 25, 101, 1000):
        for fraction in (0.01, 0.1, 0.25, 0.5, 0.9):
            recs = [{"prompt": f"p{i}", "completion": str(i)} for i in range(n)]
            recs[: len(chats)] = [{"prompt": c, "answer": "a"} for c in chats][:n]
            if n - max(1, int(n * fraction)) < 1:
                continue
            assert tasks.split(recs, fraction) == old_split(recs, fraction)


def prompt_lacks(prompt: str, answer: str) -> bool:
    return any(c not in prompt for c in answer)


def shortcut_score(recs: list[dict[str, str]]) -> float:
    """A model-free preference: the answer holding a character the prompt lacks is the rejected
    one (ties count one half). Chance is 0.5; the old rejected answers gave it about 0.9."""
    score = 0.0
    for r in recs:
        c, j = prompt_lacks(r["prompt"], r["chosen"]), prompt_lacks(r["prompt"], r["rejected"])
        score += 1.0 if j and not c else 0.0 if c and not j else 0.5
    return score / len(recs)


@pytest.mark.parametrize(
    "problems",
    [
        tasks.reversal(1000, length=3, seed=0),
        tasks.last_letter(1000, length=4, seed=0),
        tasks.addition(1000, digits=2, seed=0),
        tasks.addition(100, digits=1, seed=0),
    ],
)
def test_dpo_rejected_has_no_letter_shortcut(problems):
    recs = tasks.records(problems, "dpo", seed=0)
    assert shortcut_score(recs) == pytest.approx(0.5, abs=0.02)
    for r in recs:
        wrong, right = r["rejected"], r["chosen"]
        assert wrong != right and len(wrong) == len(right)
        assert [c.isdigit() for c in wrong] == [c.isdigit() for c in right]
        if right.isalpha() and len(set(right)) > 1:  # the same letters in a wrong order
            assert sorted(wrong) == sorted(right)


def test_dpo_rejected_is_wrong_and_same_width():
    recs = tasks.records(tasks.addition(200, digits=2), "dpo", seed=0)
    for r in recs:
        assert r["rejected"] != r["chosen"] and len(r["rejected"]) == len(r["chosen"])
        assert r["rejected"].isdigit()
        assert len(r["rejected"]) == 1 or r["rejected"][0] != "0"  # no "01" for "10"


def test_write_and_load_roundtrip_with_hash(tmp_path):
    path = tmp_path / "d.jsonl"
    recs = tasks.records(tasks.reversal(20, seed=0), "sft")
    h = tasks.write_jsonl(path, recs)
    assert h == hashlib.sha256(path.read_bytes()).digest()
    assert tasks.load_records(path, "sft", h) == recs
    assert tasks.load_records(f"file://{path}", "sft", None) == recs
    with pytest.raises(DatasetError, match="sha256"):
        tasks.load_records(path, "sft", hashlib.sha256(b"other").digest())
    with pytest.raises(DatasetError, match="does not exist"):
        tasks.load_records(tmp_path / "missing.jsonl", "sft", None)


def write_lines(tmp_path, lines: list[str]):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = json.dumps({"prompt": "1+2=", "completion": "3"})


def test_sft_files_are_written_with_completion_and_old_response_files_still_load(tmp_path):
    recs = tasks.records(tasks.addition(3, seed=0), "sft")
    assert all(set(r) == {"prompt", "completion"} for r in recs)
    old = write_lines(tmp_path, [json.dumps({"prompt": "1+2=", "response": "3"})] * 2)
    assert tasks.load_records(old, "sft") == [{"prompt": "1+2=", "completion": "3"}] * 2


def test_split_holds_out_last_tenth():
    recs = [{"prompt": str(i)} for i in range(25)]
    train, held = tasks.split(recs)
    assert train == recs[:23] and held == recs[23:]
    assert tasks.split(recs[:3]) == (recs[:2], recs[2:3])  # at least one held out


def test_backend_rejects_bad_dataset_before_training(tmp_path):
    path = write_lines(tmp_path, [GOOD] * 10 + ['{"prompt": "1+2=", "completion": 3}'])
    job = tiny_job("sft", path)
    with pytest.raises(DatasetError, match=r"^dataset \S+ line 11: completion must be a string"):
        make_backend(job)


def test_grpo_backend_requires_one_answer_width(tmp_path):
    path = tmp_path / "g.jsonl"
    h = tasks.make_dataset(path, "grpo", tasks.addition(50, digits=1, seed=0))  # 1 and 2 wide
    with pytest.raises(DatasetError, match="one width"):
        make_backend(tiny_job("grpo", path, h))
