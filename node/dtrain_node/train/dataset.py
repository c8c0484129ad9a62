"""A job's dataset file, read, checked against its sha256 and validated whole before training.

Formats (docs/methods.md "Data formats"; JSONL: one JSON object per line, UTF-8, "\\n"-separated):
  cpt:  a UTF-8 text file (the whole file is one document), or JSONL {"text": str} (one
        document per line): JSONL when the first line is a JSON object, whatever the file's name
  sft:  {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]} (at least
        one user message; the last is the assistant's), or {"prompt": Prompt, "completion": str}
        ("response" is read as the old name of "completion")
  dpo:  {"prompt": Prompt, "chosen": str, "rejected": str} (chosen != rejected)
  grpo: {"prompt": Prompt, "answer": str} (the answer checked against the recipe's reward)
A Prompt is a string or a list of messages ending with a user message. Every string is
non-empty; keys other than these are errors (a typo must not train on nothing); a blank line is
an error (only the file's final newline may end it), so is a UTF-8 byte order mark.

Records come back normalised: sft {"prompt", "completion"} (a messages record's prompt is all
its messages but the last, its completion the last one's content), dpo {"prompt", "chosen",
"rejected"}, grpo {"prompt", "answer"}; messages as {"role", "content"} dicts. Errors are one
`DatasetError` listing up to MAX_ERRORS bad lines, each "dataset PATH line N: what is wrong",
then what a line should look like. This module imports no torch: the SDK's `dtrain job submit`
and `dtrain data check` run `check_dataset` through the `dtrain.dataset_check` entry point.
"""

from __future__ import annotations

import codecs
import difflib
import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtrain_node.errors import DatasetError
from dtrain_node.train import rewards

METHODS = ("cpt", "sft", "dpo", "grpo")
ROLES = ("system", "user", "assistant")
MAX_ERRORS = 5  # bad lines reported before validation stops
MIN_RECORDS = 2  # a training split and a held-out split
MAX_DEPTH = 32  # nested arrays/objects of a line (a record needs 3; the C parser's stack is finite)

Message = dict[str, str]
Prompt = str | list[Message]
Record = dict[str, Any]

EXAMPLES = {
    "cpt": '{"text": "one document"}',
    "sft": '{"messages": [{"role": "user", "content": "2+2="}, {"role": "assistant", '
    '"content": "4"}]} or {"prompt": "2+2=", "completion": "4"}',
    "dpo": '{"prompt": "2+2=", "chosen": "4", "rejected": "5"}',
    "grpo": '{"prompt": "2+2=", "answer": "4"}',
}


class InvalidLines(DatasetError):
    """Bad lines of a dataset file: `problems` holds (1-based line number, what is wrong)."""

    def __init__(
        self, path: str, method: str, problems: list[tuple[int, str]], stopped: bool
    ) -> None:
        self.path, self.problems = path, problems
        lines = [f"dataset {path} line {n}: {what}" for n, what in problems]
        if stopped:
            lines.append(f"(stopped after {MAX_ERRORS} bad lines)")
        lines.append(f"each {method} line is one JSON object such as {EXAMPLES[method]}")
        super().__init__("\n".join(lines))


class _Bad(Exception):
    """What is wrong with one line (collected with its line number)."""


def read_dataset(path: str | os.PathLike, expected: bytes | None) -> bytes:
    """A dataset file's bytes, checked against the job's sha256 (None or all zeros: unchecked)."""
    path = Path(str(path).removeprefix("file://"))
    if not path.is_file():
        raise DatasetError(f"dataset {path} does not exist")
    data = path.read_bytes()
    if expected is not None and any(expected):
        got = hashlib.sha256(data).digest()
        if got != bytes(expected):
            raise DatasetError(
                f"dataset {path} sha256 {got.hex()[:16]}.. != job's {bytes(expected).hex()[:16]}.."
            )
    return data


def _kind(value: object) -> str:
    """The JSON name of a parsed value's type."""
    if isinstance(value, bool):
        return "true/false"
    names = {dict: "an object", list: "an array", str: "a string", type(None): "null"}
    return names.get(type(value), "a number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise _Bad(f"key {dup!r} appears twice")
    return dict(pairs)


def _depth(text: str) -> int:
    """The deepest nesting of arrays and objects in a JSON text (outside strings)."""
    depth = most = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped = not escaped and ch == "\\"
            in_string = escaped or ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            most = max(most, depth)
        elif ch in "]}":
            depth -= 1
    return most


def _json(raw: bytes) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(
            f"is not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
        ) from None
    if not text.strip():
        raise _Bad("is blank (only the file's last newline may end it; remove empty lines)")
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth(text) > MAX_DEPTH:
        raise _Bad(f"nests arrays or objects deeper than {MAX_DEPTH}")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise _Bad(f"is not JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5000 digits
        raise _Bad(f"is not JSON this reader accepts ({type(exc).__name__})") from None


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{where} must be a string, got {_kind(value)}")
    if not value:
        raise _Bad(f"{where} is empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Bad(f"{where} holds an unpaired surrogate escape (\\ud800-\\udfff)") from None
    return value


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"{what} must be a JSON object, got {_kind(value)}")
    return value


def _keys(rec: dict[str, Any], keys: tuple[str, ...], what: str = "") -> None:
    """`rec` has exactly `keys`: an unknown key (with the nearest known one) or a missing one
    is an error."""
    for k in rec:
        if k not in keys:
            near = difflib.get_close_matches(k, keys, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            known = ", ".join(map(repr, keys))
            raise _Bad(f"{what}unknown key {k!r}{hint}; the keys are {known}")
    missing = [k for k in keys if k not in rec]
    if missing:
        raise _Bad(f"{what}missing key {', '.join(map(repr, missing))}")


def _messages(value: object, where: str, last_role: str) -> list[Message]:
    """A chat: a non-empty list of {"role", "content"}, a system message only first, at least
    one user message, ending with a `last_role` message."""
    if not isinstance(value, list) or not value:
        got = "an empty array" if value == [] else _kind(value)
        raise _Bad(f"{where} must be a non-empty array of messages, got {got}")
    out = []
    for i, m in enumerate(value):
        at = f"{where}[{i}]"
        _keys(_object(m, at), ("role", "content"), f"{at}: ")
        role = m["role"]
        if role not in ROLES:
            raise _Bad(f"{at} role {role!r} is not one of {', '.join(ROLES)}")
        if role == "system" and i > 0:
            raise _Bad(f"{at} is a system message; only the first message may be one")
        out.append({"role": role, "content": _text(m["content"], f"{at} content")})
    if not any(m["role"] == "user" for m in out):
        raise _Bad(f"{where} has no user message")
    if out[-1]["role"] != last_role:
        raise _Bad(f"{where} must end with a {last_role} message, not {out[-1]['role']}")
    return out


def _prompt(value: object) -> Prompt:
    if isinstance(value, list):
        return _messages(value, "prompt", "user")
    if not isinstance(value, str):
        raise _Bad(f"prompt must be a string or an array of messages, got {_kind(value)}")
    return _text(value, "prompt")


def _form(prompt: Prompt) -> str:
    return "text" if isinstance(prompt, str) else "chat"


def _sft(value: object, reward: str) -> tuple[Record, str]:
    rec = _object(value, "the line")
    if "messages" in rec:
        _keys(rec, ("messages",), "a messages record: ")
        chat = _messages(rec["messages"], "messages", "assistant")
        return {"prompt": chat[:-1], "completion": chat[-1]["content"]}, "messages"
    if "response" in rec and "completion" in rec:
        raise _Bad("has both 'completion' and its old name 'response'; keep 'completion'")
    name = "response" if "response" in rec else "completion"
    _keys(rec, ("prompt", name))
    prompt = _prompt(rec["prompt"])
    return {"prompt": prompt, "completion": _text(rec[name], name)}, "prompt/completion"


def _dpo(value: object, reward: str) -> tuple[Record, str]:
    rec = _object(value, "the line")
    _keys(rec, ("prompt", "chosen", "rejected"))
    prompt = _prompt(rec["prompt"])
    chosen, rejected = _text(rec["chosen"], "chosen"), _text(rec["rejected"], "rejected")
    if chosen == rejected:
        raise _Bad("chosen and rejected are the same")
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}, _form(prompt)


def _grpo(value: object, reward: str) -> tuple[Record, str]:
    rec = _object(value, "the line")
    _keys(rec, ("prompt", "answer"))
    prompt = _prompt(rec["prompt"])
    answer = _text(rec["answer"], "answer")
    problem = rewards.answer_problem(reward, answer)
    if problem:
        raise _Bad(problem)
    return {"prompt": prompt, "answer": answer}, _form(prompt)


def _document(value: object, reward: str) -> tuple[Record, str]:
    rec = _object(value, "the line")
    _keys(rec, ("text",))
    return {"text": _text(rec["text"], "text")}, "jsonl"


PARSERS: dict[str, Callable[[object, str], tuple[Record, str]]] = {
    "cpt": _document,
    "sft": _sft,
    "dpo": _dpo,
    "grpo": _grpo,
}


def prompt_text(prompt: Prompt) -> str:
    """A prompt's text: itself, or its messages' contents joined by newlines."""
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


def _size(rec: Record) -> int:
    """UTF-8 bytes of the prompt (its contents) plus the longest completion."""
    targets = [rec[k] for k in ("completion", "chosen", "rejected", "answer") if k in rec]
    return len(prompt_text(rec["prompt"]).encode()) + max(len(t.encode()) for t in targets)


def parse_jsonl(
    path: str | os.PathLike,
    data: bytes,
    method: str,
    reward: str = "exact",
    max_bytes: int | None = None,
) -> tuple[list[Record], list[str]]:
    """Every line of a JSONL file of `method` parsed and validated: (records, their forms).
    Raises InvalidLines naming up to MAX_ERRORS bad lines."""
    if method not in PARSERS:
        raise DatasetError(f"no record format for method {method!r}; known: {', '.join(METHODS)}")
    parse = PARSERS[method]
    # Split on "\n" only: str.splitlines() would also split inside strings holding U+2028 etc.
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    recs: list[Record] = []
    forms: list[str] = []
    problems: list[tuple[int, str]] = []
    for number, raw in enumerate(lines, start=1):
        try:
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raise _Bad("starts with a UTF-8 byte order mark (BOM): save as UTF-8 without one")
            rec, form = parse(_json(raw), reward)
            if max_bytes is not None and _size(rec) > max_bytes:
                raise _Bad(f"{_size(rec)} bytes is too long (limit {max_bytes})")
        except _Bad as exc:
            problems.append((number, str(exc)))
            if len(problems) == MAX_ERRORS:
                raise InvalidLines(str(path), method, problems, number < len(lines)) from None
            continue
        recs.append(rec)
        forms.append(form)
    if problems:
        raise InvalidLines(str(path), method, problems, stopped=False)
    return recs, forms


def load_records(
    path: str | os.PathLike,
    method: str,
    expected: bytes | None = None,
    max_bytes: int | None = None,
    reward: str = "exact",
) -> list[Record]:
    """Every record of an SFT/DPO/GRPO dataset, validated and normalised (module doc).

    `expected` is the sha256 from the job spec (None or all zeros: not checked, for local
    runs); `max_bytes` optionally bounds prompt + longest completion in UTF-8 bytes (a
    tokenizer-aware caller checks tokens instead); `reward` is the recipe's GRPO reward, which
    the answers must suit (a regex answer compiles, a numeric one is a number).
    """
    if method not in PARSERS or method == "cpt":
        raise DatasetError(
            f"no record format for method {method!r}; known: {', '.join(METHODS[1:])} "
            "(cpt reads documents: load_documents)"
        )
    recs, _ = parse_jsonl(path, read_dataset(path, expected), method, reward, max_bytes)
    if len(recs) < MIN_RECORDS:
        raise DatasetError(
            f"dataset {path} has {len(recs)} records; need >= {MIN_RECORDS} (train + held-out)"
        )
    return recs


def is_jsonl(data: bytes) -> bool:
    """Whether a CPT file is JSONL documents: its first line is a JSON object. Decided by the
    bytes, never the file's name: an operator reads a fetched dataset from its cache, where
    files are named by their sha256 alone, and must read it as the caller did."""
    first = data.split(b"\n", 1)[0].removeprefix(codecs.BOM_UTF8).strip()
    if not first.startswith(b"{"):
        return False
    try:
        return isinstance(_json(first), dict)
    except _Bad:
        return False


def load_documents(path: str | os.PathLike, expected: bytes | None = None) -> list[str]:
    """A CPT dataset's documents: the {"text"} lines of a JSONL file (one whose first line is a
    JSON object), else the whole file (UTF-8 text, no byte order mark) as one document."""
    data = read_dataset(path, expected)
    if is_jsonl(data):
        recs, _ = parse_jsonl(path, data, "cpt")  # one record at least: its first line is one
        return [r["text"] for r in recs]
    if data.startswith(codecs.BOM_UTF8):
        raise DatasetError(
            f"dataset {path} line 1: starts with a UTF-8 byte order mark (BOM): save as UTF-8 "
            "without one"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DatasetError(
            f"dataset {path} line {line}: is not UTF-8 (byte 0x{data[exc.start]:02x} at column "
            f"{column}); a cpt text file is UTF-8 text"
        ) from None
    if not text.strip():
        raise DatasetError(f"dataset {path} holds no text")
    return [text]


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def check_dataset(path: str, method: str, recipe: Any = None) -> str:
    """Validates the dataset file at `path` for `method` (and the recipe's GRPO reward); returns
    a summary such as "412 records (sft, messages)", and when prompts repeat what the held-out
    split holds ("; 40 prompts, held out at 0.1: 32 records of 4 prompts", or that it leaves
    nothing to train on). The `dtrain.dataset_check` entry point."""
    reward = getattr(recipe, "reward", "exact")
    if method == "grpo":
        rewards.reward_fn(reward, getattr(recipe, "reward_pattern", ""))
    if method == "cpt":
        docs = load_documents(path)
        form = "jsonl" if is_jsonl(read_dataset(path, None)) else "text"
        chars = sum(len(d) for d in docs)
        return f"{_count(len(docs), 'document')}, {_count(chars, 'character')} (cpt, {form})"
    if method not in PARSERS:
        raise DatasetError(f"no record format for method {method!r}; known: {', '.join(METHODS)}")
    recs, forms = parse_jsonl(path, read_dataset(path, None), method, reward)
    if len(recs) < MIN_RECORDS:
        raise DatasetError(
            f"dataset {path} has {len(recs)} records; need >= {MIN_RECORDS} (train + held-out)"
        )
    counts = {f: forms.count(f) for f in dict.fromkeys(forms)}
    kinds = (
        next(iter(counts))
        if len(counts) == 1
        else ", ".join(f"{n:,} {f}" for f, n in counts.items())
    )
    extra = f", reward {reward}" if method == "grpo" else ""
    summary = f"{_count(len(recs), 'record')} ({method}, {kinds}{extra})"
    prompts = len({prompt_key(r["prompt"]) for r in recs})
    if prompts == len(recs):
        return summary
    # Repeated prompts: the held-out split takes whole prompt groups, so say what it holds.
    fraction = getattr(recipe, "heldout_fraction", 0.1)
    summary = f"{summary}; {_count(prompts, 'prompt')}, held out at {fraction:g}: "
    try:
        _, held = split(recs, fraction)
    except DatasetError:
        return f"{summary}all of them, nothing left to train on (a job would refuse it)"
    held_prompts = len({prompt_key(r["prompt"]) for r in held})
    return f"{summary}{_count(len(held), 'record')} of {_count(held_prompts, 'prompt')}"


def prompt_key(prompt: Prompt) -> tuple[str, str]:
    """A hashable key equal for equal prompts (a chat by its canonical JSON)."""
    if isinstance(prompt, str):
        return ("text", prompt)
    return ("chat", json.dumps(prompt, sort_keys=True, ensure_ascii=False))


def split(recs: list[Record], heldout_fraction: float = 0.1) -> tuple[list[Record], list[Record]]:
    """(train, held-out), disjoint in prompts, both in file order. The held-out split is whole
    prompt groups (every record of a prompt), taken by walking the records from the end and adding
    each new prompt's group until it holds at least `n = max(1, int(len(recs) * fraction))`
    records. So it holds fewer than `n + g` records, g the last group added (at most one group
    over the fraction however often prompts repeat), and no held-out prompt is ever trained on.
    With unique prompts it is exactly the last n records (as before the cap)."""
    n_held = max(1, int(len(recs) * heldout_fraction))
    sizes = Counter(prompt_key(r["prompt"]) for r in recs)
    held: set[tuple[str, str]] = set()
    count = 0
    for r in reversed(recs):
        if count >= n_held:
            break
        key = prompt_key(r["prompt"])
        if key not in held:
            held.add(key)
            count += sizes[key]
    train = [r for r in recs if prompt_key(r["prompt"]) not in held]
    if not train:
        raise DatasetError(
            f"no training records left: all {len(recs)} share the held-out split's prompts"
        )
    return train, [r for r in recs if prompt_key(r["prompt"]) in held]
