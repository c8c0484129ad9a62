"""Dataset files of every method (dtrain_node.train.dataset): formats, normalised records, and
errors naming the file and the line number of every bad line (up to MAX_ERRORS)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain.recipe import Recipe
from dtrain_node.errors import DatasetError
from dtrain_node.train import dataset, tasks
from dtrain_node.train.dataset import (
    InvalidLines,
    check_dataset,
    load_documents,
    load_records,
    split,
)

USER = {"role": "user", "content": "2+2="}
BOT = {"role": "assistant", "content": "4"}
SYSTEM = {"role": "system", "content": "Answer with a number."}


def write(tmp_path, lines: list[object], name: str = "d.jsonl"):
    """A JSONL file of `lines` (objects dumped as JSON, strings written as they are)."""
    path = tmp_path / name
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    path.write_text(text, encoding="utf-8")
    return path


def bad_lines(excinfo: pytest.ExceptionInfo) -> dict[int, str]:
    """line number -> message, from an InvalidLines error, checked against its text."""
    err = excinfo.value
    assert isinstance(err, InvalidLines)
    for n, what in err.problems:
        assert f"dataset {err.path} line {n}: {what}" in str(err)
    return dict(err.problems)


# ---------------------------------------------------------------------- sft


def test_sft_messages_and_prompt_completion_are_normalised(tmp_path):
    path = write(
        tmp_path,
        [
            {"messages": [SYSTEM, USER, BOT]},
            {"prompt": "2+2=", "completion": "4"},
            {"prompt": "2+2=", "response": "4"},  # the old name of completion
            {"prompt": [USER], "completion": "4"},
            {"messages": [USER, BOT, USER, {"role": "assistant", "content": "8"}]},
        ],
    )
    recs = load_records(path, "sft", hashlib.sha256(path.read_bytes()).digest())
    assert recs == [
        {"prompt": [SYSTEM, USER], "completion": "4"},
        {"prompt": "2+2=", "completion": "4"},
        {"prompt": "2+2=", "completion": "4"},
        {"prompt": [USER], "completion": "4"},
        {"prompt": [USER, BOT, USER], "completion": "8"},
    ]
    assert check_dataset(str(path), "sft") == (
        "5 records (sft, 2 messages, 3 prompt/completion); 4 prompts, held out at 0.1: "
        "1 record of 1 prompt"
    )


SFT_BAD = [
    ({"prompt": "2+2=", "complection": "4"}, "unknown key 'complection' (did you mean"),
    ({"prompt": "2+2="}, "missing key 'completion'"),
    ({"prompt": "2+2=", "completion": ""}, "completion is empty"),
    ({"prompt": "", "completion": "4"}, "prompt is empty"),
    ({"prompt": 12, "completion": "4"}, "prompt must be a string or an array of messages"),
    ({"prompt": "2+2=", "completion": 4}, "completion must be a string, got a number"),
    ({"prompt": "2+2=", "completion": None}, "completion must be a string, got null"),
    ({"prompt": "a", "completion": "b", "response": "b"}, "has both 'completion'"),
    ({"prompt": "a", "completion": "b", "id": 3}, "unknown key 'id'"),
    ({"messages": [USER, BOT], "prompt": "x"}, "a messages record: unknown key 'prompt'"),
    ({"messages": []}, "messages must be a non-empty array of messages, got an empty array"),
    ({"messages": "hi"}, "messages must be a non-empty array of messages, got a string"),
    ({"messages": [USER]}, "messages must end with a assistant message, not user"),
    ({"messages": [SYSTEM, BOT]}, "messages has no user message"),
    ({"messages": [USER, SYSTEM, BOT]}, "messages[1] is a system message; only the first"),
    ({"messages": [{"role": "bot", "content": "x"}, BOT]}, "messages[0] role 'bot' is not one"),
    ({"messages": [{"role": "user"}, BOT]}, "messages[0]: missing key 'content'"),
    ({"messages": [{"role": "user", "text": "x"}, BOT]}, "messages[0]: unknown key 'text'"),
    ({"messages": [USER, {"role": "assistant", "content": ""}]}, "messages[1] content is empty"),
    ({"messages": ["hi", BOT]}, "messages[0] must be a JSON object, got a string"),
    ({"prompt": [BOT], "completion": "4"}, "prompt has no user message"),
    ({"prompt": [USER, BOT], "completion": "4"}, "prompt must end with a user message"),
    ([1, 2], "the line must be a JSON object, got an array"),
    ("{not json", "is not JSON (Expecting property name enclosed in double quotes at column 2)"),
    ('{"prompt": "a", "prompt": "b", "completion": "c"}', "key 'prompt' appears twice"),
    ('{"prompt": "\\ud800", "completion": "c"}', "prompt holds an unpaired surrogate"),
    ("   ", "is blank"),
    ("", "is blank"),
    ("[" * 100_000, "nests arrays or objects deeper than 32"),
    ('{"prompt": 1' + "0" * 5000 + ', "completion": "c"}', "is not JSON this reader accepts"),
]


@pytest.mark.parametrize(("bad", "reason"), SFT_BAD)
def test_bad_sft_line_is_named_by_its_number(tmp_path, bad, reason):
    good = {"prompt": "1+2=", "completion": "3"}
    path = write(tmp_path, [good, good, bad, good])
    with pytest.raises(DatasetError) as exc:
        load_records(path, "sft")
    problems = bad_lines(exc)
    assert list(problems) == [3] and reason in problems[3], problems
    assert str(exc.value).startswith(f"dataset {path} line 3: ")
    assert str(exc.value).splitlines()[-1].startswith("each sft line is one JSON object such as")


def test_every_bad_line_is_listed_up_to_the_limit(tmp_path):
    good = {"prompt": "1+2=", "completion": "3"}
    path = write(tmp_path, [good, "{", good, {"prompt": "x"}, "", good])
    with pytest.raises(DatasetError) as exc:
        load_records(path, "sft")
    assert list(bad_lines(exc)) == [2, 4, 5]
    assert "stopped" not in str(exc.value)
    path = write(tmp_path, [good] + ["{"] * 20)
    with pytest.raises(DatasetError) as exc:
        load_records(path, "sft")
    assert list(bad_lines(exc)) == [2, 3, 4, 5, 6]  # MAX_ERRORS, then it stops
    assert f"(stopped after {dataset.MAX_ERRORS} bad lines)" in str(exc.value)


def test_whole_file_is_validated_even_its_last_line(tmp_path):
    good = {"prompt": "1+2=", "completion": "3"}
    path = write(tmp_path, [good] * 999 + [{"prompt": "1+2="}])
    with pytest.raises(DatasetError, match=r"line 1000: missing key 'completion'"):
        load_records(path, "sft")


def test_bytes_level_problems(tmp_path):
    path = tmp_path / "d.jsonl"
    good = b'{"prompt": "a", "completion": "b"}'
    path.write_bytes(b"\xef\xbb\xbf" + good + b"\n" + good + b"\n")
    with pytest.raises(DatasetError, match=r"line 1: starts with a UTF-8 byte order mark"):
        load_records(path, "sft")
    path.write_bytes(good + b"\n" + b'{"prompt": "\xff", "completion": "b"}\n')
    with pytest.raises(DatasetError, match=r"line 2: is not UTF-8 \(byte 0xff at column 13\)"):
        load_records(path, "sft")
    path.write_bytes(good + b"\r\n" + good)  # CRLF and no final newline are fine
    assert len(load_records(path, "sft")) == 2
    path.write_bytes(good + b"\n\n")  # one final newline only
    with pytest.raises(DatasetError, match=r"line 2: is blank"):
        load_records(path, "sft")
    path.write_bytes(b"")
    with pytest.raises(DatasetError, match="has 0 records; need >= 2"):
        load_records(path, "sft")


def test_brackets_inside_strings_are_no_nesting(tmp_path):
    deep_text = {"prompt": "[{" * 100, "completion": "}]" * 100}
    assert load_records(write(tmp_path, [deep_text] * 2), "sft")[0] == deep_text


def test_max_bytes_hook_counts_prompt_and_longest_completion(tmp_path):
    path = write(tmp_path, [{"prompt": "abc", "completion": "de"}] * 2)
    assert len(load_records(path, "sft", max_bytes=5)) == 2
    with pytest.raises(DatasetError, match=r"line 1: 5 bytes is too long \(limit 4\)"):
        load_records(path, "sft", max_bytes=4)


def test_hash_and_path_errors(tmp_path):
    path = write(tmp_path, [{"prompt": "a", "completion": "b"}] * 2)
    good = hashlib.sha256(path.read_bytes()).digest()
    assert load_records(f"file://{path}", "sft", good)
    assert load_records(path, "sft", b"\0" * 32)  # all zeros: unchecked (local runs)
    with pytest.raises(DatasetError, match=r"sha256 .* != job's"):
        load_records(path, "sft", hashlib.sha256(b"other").digest())
    with pytest.raises(DatasetError, match=r"sha256 .* != job's"):
        load_documents(path, hashlib.sha256(b"other").digest())
    with pytest.raises(DatasetError, match="does not exist"):
        load_records(tmp_path / "missing.jsonl", "sft")
    with pytest.raises(DatasetError, match="no record format for method 'cpt'"):
        load_records(path, "cpt")
    with pytest.raises(DatasetError, match="no record format for method 'ppo'"):
        check_dataset(str(path), "ppo")


# ---------------------------------------------------------------------- dpo, grpo


def test_dpo_records(tmp_path):
    ok = {"prompt": [SYSTEM, USER], "chosen": "4", "rejected": "5"}
    path = write(
        tmp_path,
        [
            ok,
            {"prompt": "p", "chosen": "a", "rejected": "a"},
            {"prompt": "p", "chosen": "a"},
            {"prompt": "p", "chosen": "a", "rejected": "b", "completion": "c"},
        ],
    )
    with pytest.raises(DatasetError) as exc:
        load_records(path, "dpo")
    problems = bad_lines(exc)
    assert problems[2] == "chosen and rejected are the same"
    assert problems[3] == "missing key 'rejected'"
    assert problems[4].startswith("unknown key 'completion'")
    assert "each dpo line is one JSON object" in str(exc.value)
    path = write(tmp_path, [ok, {"prompt": "p", "chosen": "a", "rejected": "b"}])
    assert load_records(path, "dpo")[0] == ok
    assert check_dataset(str(path), "dpo") == "2 records (dpo, 1 chat, 1 text)"


def test_grpo_answers_suit_the_recipes_reward(tmp_path):
    path = write(
        tmp_path,
        [
            {"prompt": "2+2=", "answer": "4"},
            {"prompt": "big", "answer": "1,234"},
            {"prompt": "word", "answer": "four"},
            {"prompt": "re", "answer": "(a+)+"},
            {"prompt": "re", "answer": "[0-9"},
        ],
    )
    assert len(load_records(path, "grpo")) == 5  # exact: any non-empty answer
    assert len(load_records(path, "grpo", reward="contains")) == 5
    with pytest.raises(DatasetError) as exc:
        load_records(path, "grpo", reward="numeric")
    problems = bad_lines(exc)
    assert list(problems) == [3, 4, 5] and "'four' is not a number" in problems[3]
    with pytest.raises(DatasetError) as exc:
        load_records(path, "grpo", reward="regex")
    problems = bad_lines(exc)
    assert list(problems) == [4, 5]
    assert "repeats a variable-length part" in problems[4]
    assert "is not a valid regex" in problems[5]
    with pytest.raises(DatasetError, match=r"line 1: unknown key 'completion'"):
        load_records(write(tmp_path, [{"prompt": "p", "completion": "c"}] * 2), "grpo")


def test_check_dataset_reads_the_reward_from_the_recipe(tmp_path):
    path = write(tmp_path, [{"prompt": "2+2=", "answer": "4"}, {"prompt": "w", "answer": "x"}])
    assert check_dataset(str(path), "grpo", Recipe()) == "2 records (grpo, text, reward exact)"
    with pytest.raises(DatasetError, match=r"line 2: answer 'x' is not a number"):
        check_dataset(str(path), "grpo", Recipe(reward="numeric"))
    fmt = Recipe(reward="format", reward_pattern="<a>(.*)</a>")
    assert check_dataset(str(path), "grpo", fmt).endswith("reward format)")


# ---------------------------------------------------------------------- cpt


def test_cpt_text_and_jsonl_documents(tmp_path):
    txt = tmp_path / "c.txt"
    txt.write_text("héllo\nwörld\n", encoding="utf-8")
    assert load_documents(txt, hashlib.sha256(txt.read_bytes()).digest()) == ["héllo\nwörld\n"]
    assert check_dataset(str(txt), "cpt") == "1 document, 12 characters (cpt, text)"
    jsonl = write(tmp_path, [{"text": "one"}, {"text": "two"}], "c.jsonl")
    assert load_documents(jsonl) == ["one", "two"]
    assert check_dataset(str(jsonl), "cpt") == "2 documents, 6 characters (cpt, jsonl)"
    cached = write(tmp_path, [{"text": "one"}, {"text": "two"}], "0f" * 32)  # a cache's name
    assert load_documents(cached) == ["one", "two"]
    code = write(tmp_path, ["{", '  "not": "a record"', "}"], "c.jsonl")  # a JSON text
    assert load_documents(code) == [code.read_text()]


def test_cpt_errors_name_the_line(tmp_path):
    txt = tmp_path / "c.txt"
    txt.write_bytes(b"fine\nfine\nbad \xc3( here\n")
    with pytest.raises(DatasetError, match=r"c.txt line 3: is not UTF-8 \(byte 0xc3 at column 5\)"):
        load_documents(txt)
    txt.write_bytes(b"\xef\xbb\xbfhello")
    with pytest.raises(DatasetError, match="line 1: starts with a UTF-8 byte order mark"):
        load_documents(txt)
    txt.write_bytes(b" \n")
    with pytest.raises(DatasetError, match="holds no text"):
        load_documents(txt)
    jsonl = write(tmp_path, [{"text": "one"}, {"txt": "two"}, {"text": ""}], "c.txt")
    with pytest.raises(DatasetError) as exc:
        load_documents(jsonl)
    assert bad_lines(exc) == {
        2: "unknown key 'txt' (did you mean 'text'?); the keys are 'text'",
        3: "text is empty",
    }
    (tmp_path / "e.jsonl").write_bytes(b"")
    with pytest.raises(DatasetError, match="holds no text"):
        load_documents(tmp_path / "e.jsonl")


def test_stdlib_corpus_is_valid_cpt_text(tmp_path):
    from dtrain_node.train import corpus

    path = tmp_path / "corpus.txt"
    corpus.build_stdlib_corpus(path, max_bytes=20_000)
    assert load_documents(path)[0] == path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------- split


def test_split_keys_chat_prompts_by_content():
    chat = [{"role": "user", "content": "q"}]
    recs = [
        {"prompt": "a", "completion": "1"},
        {"prompt": [dict(c) for c in chat], "completion": "2"},
    ]
    recs += [{"prompt": "b", "completion": "3"}, {"prompt": chat, "completion": "4"}]
    train, held = split(recs, 0.25)
    assert train == [recs[0], recs[2]] and held == [recs[1], recs[3]]
    text_like = [{"prompt": json.dumps(chat), "completion": "5"}, *recs]
    assert text_like[0] in split(text_like, 0.2)[0]  # a text prompt never equals a chat


def test_check_dataset_says_what_the_held_out_split_holds_when_prompts_repeat(tmp_path):
    path = tmp_path / "rep.jsonl"
    recs = [{"prompt": f"q{i % 40}", "completion": str(i)} for i in range(300)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert check_dataset(str(path), "sft") == (
        "300 records (sft, prompt/completion); 40 prompts, held out at 0.1: 32 records of 4 prompts"
    )
    got = check_dataset(str(path), "sft", Recipe(heldout_fraction=0.25))
    assert got.endswith("held out at 0.25: 80 records of 10 prompts")
    path.write_text(
        "".join(json.dumps({"prompt": "p", "completion": str(i)}) + "\n" for i in range(5))
    )
    assert check_dataset(str(path), "sft") == (
        "5 records (sft, prompt/completion); 1 prompt, held out at 0.1: all of them, nothing "
        "left to train on (a job would refuse it)"
    )


# ---------------------------------------------------------------------- fuzz

KEYS = ["prompt", "completion", "response", "messages", "chosen", "rejected", "answer", "text"]
KEYS += ["role", "content", "x"]
LINE = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=6),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "prompt",
                        "completion",
                        "response",
                        "messages",
                        "chosen",
                        "rejected",
                        "answer",
                        "text",
                        "role",
                        "content",
                        "x",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=8,
    ).map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=300, deadline=None)
@given(
    method=st.sampled_from(["sft", "dpo", "grpo"]),
    reward=st.sampled_from(["exact", "numeric", "regex"]),
    lines=st.lists(LINE, max_size=6),
    end=st.sampled_from([b"", b"\n", b"\r\n"]),
)
def test_fuzz_parser_returns_valid_records_or_raises_dataset_error(
    tmp_path_factory, method, reward, lines, end
):
    path = tmp_path_factory.mktemp("fuzz") / "d.jsonl"
    path.write_bytes(b"\n".join(lines) + end)
    try:
        recs = load_records(path, method, reward=reward)
    except DatasetError as exc:
        assert re.search(r"line \d+: |need >= 2", str(exc)), str(exc)
        return
    keys = {"sft": {"prompt", "completion"}, "dpo": {"prompt", "chosen", "rejected"}}
    for r in recs:
        assert set(r) == keys.get(method, {"prompt", "answer"})
        assert all(isinstance(v, str) and v for k, v in r.items() if k != "prompt")
        assert isinstance(r["prompt"], str | list) and r["prompt"]
        json.dumps(r, ensure_ascii=False).encode()  # every string is valid UTF-8


text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=10)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(text, text, text).filter(lambda t: t[1] != t[2]), min_size=2))
def test_any_valid_dpo_records_roundtrip(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("h") / "d.jsonl"
    recs = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in rows]
    h = tasks.write_jsonl(path, recs)
    assert load_records(path, "dpo", h) == recs


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200) | LINE, name=st.sampled_from(["c.txt", "c.jsonl", "0f" * 32]))
def test_fuzz_documents_are_text_or_raise_dataset_error(tmp_path_factory, data, name):
    path = tmp_path_factory.mktemp("fuzz") / name
    path.write_bytes(data)
    try:
        docs = load_documents(path)
    except DatasetError as exc:
        assert re.search(r"line \d+: |holds no text", str(exc)), str(exc)
        return
    assert docs and all(isinstance(d, str) and d for d in docs)


# ---------------------------------------------------------------------- the SDK's view


def test_sdk_check_turns_dataset_errors_into_config_errors(tmp_path):
    from dtrain import pins
    from dtrain.errors import ConfigError

    path = write(tmp_path, [{"prompt": "a", "completion": "b"}, {"prompt": "a"}])
    with pytest.raises(ConfigError, match=r"line 2: missing key 'completion'"):
        pins.check_dataset(str(path), "sft")
    path = write(tmp_path, [{"prompt": "a", "completion": "b"}] * 2)
    assert pins.check_dataset(f"file://{path}", "sft").startswith(
        "2 records (sft, prompt/completion); 1 prompt"
    )
    assert [pins.is_local(u) for u in ["d.jsonl", "/a/d.txt", "file:///a", "C:\\d"]] == [True] * 4
    assert not any(pins.is_local(u) for u in ["p2p:/ip4/1.2.3.4/tcp/1/p2p/Qm", "https://x/d"])
