"""Offline tasks with checkable answers and the JSONL dataset files of SFT, DPO and GRPO.

Formats (one JSON object per line, UTF-8; see docs/methods.md):
  sft:  {"prompt": str, "response": str}
  dpo:  {"prompt": str, "chosen": str, "rejected": str}
  grpo: {"prompt": str, "answer": str}
CPT uses raw text files (corpus.py). A dataset is addressed by its file's sha256, which goes into
the job spec; `load_records` checks it and validates every record before training starts, so a
bad record fails the job up front with its 1-based record number instead of mid-epoch.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from dtrain_node.errors import DatasetError
from dtrain_node.train.corpus import read_dataset

FIELDS = {
    "sft": ("prompt", "response"),
    "dpo": ("prompt", "chosen", "rejected"),
    "grpo": ("prompt", "answer"),
}
MAX_BYTES = 120  # prompt + longest completion (UTF-8 bytes); the tiny model's ctx is 128 tokens


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str

    def __post_init__(self) -> None:
        if not self.prompt or not self.answer:
            raise ValueError("a problem needs a non-empty prompt and answer")


def addition(n: int, digits: int = 1, seed: int = 0, max_sum: int | None = None) -> list[Problem]:
    """n distinct problems "a+b=" -> "a+b" with operands of up to `digits` digits, shuffled.

    max_sum bounds the answer (e.g. 9 keeps answers one digit wide). n is capped at the number of
    distinct problems.
    """
    hi = 10**digits
    pairs = [(a, b) for a in range(hi) for b in range(hi) if max_sum is None or a + b <= max_sum]
    random.Random(seed).shuffle(pairs)
    return [Problem(f"{a}+{b}=", str(a + b)) for a, b in pairs[:n]]


def reversal(n: int, length: int = 4, seed: int = 0, alphabet: str = "abcdef") -> list[Problem]:
    """n problems "rev abcd:" -> "dcba" over a small alphabet (repeats possible for tiny n)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = "".join(rng.choice(alphabet) for _ in range(length))
        out.append(Problem(f"rev {s}:", s[::-1]))
    return out


def wrong_answer(p: Problem, rng: random.Random) -> str:
    """A plausible wrong answer of the same width: one character changed (digits stay digits)."""
    chars = list(p.answer)
    i = rng.randrange(len(chars))
    pool = "0123456789" if chars[i].isdigit() else "abcdefghijklmnopqrstuvwxyz"
    chars[i] = rng.choice([c for c in pool if c != chars[i]])
    return "".join(chars)


def records(problems: list[Problem], method: str, seed: int = 0) -> list[dict[str, str]]:
    if method == "sft":
        return [{"prompt": p.prompt, "response": p.answer} for p in problems]
    if method == "dpo":
        rng = random.Random(seed)
        return [
            {"prompt": p.prompt, "chosen": p.answer, "rejected": wrong_answer(p, rng)}
            for p in problems
        ]
    if method == "grpo":
        return [{"prompt": p.prompt, "answer": p.answer} for p in problems]
    raise ValueError(f"no record format for method {method!r}; known: {', '.join(FIELDS)}")


def write_jsonl(path: str | os.PathLike, recs: list[dict[str, str]]) -> bytes:
    """Writes records one per line (sorted keys: same records, same bytes); returns the sha256."""
    data = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in recs).encode()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).digest()


def make_dataset(
    path: str | os.PathLike, method: str, problems: list[Problem], seed: int = 0
) -> bytes:
    return write_jsonl(path, records(problems, method, seed))


def _check(rec: object, method: str, number: int, max_bytes: int) -> dict[str, str]:
    if not isinstance(rec, dict):
        raise DatasetError(f"record {number}: expected a JSON object, got {type(rec).__name__}")
    out = {}
    for f in FIELDS[method]:
        if f not in rec:
            raise DatasetError(
                f"record {number}: missing field {f!r} ({method} needs {FIELDS[method]})"
            )
        v = rec[f]
        if not isinstance(v, str):
            raise DatasetError(
                f"record {number}: field {f!r} must be a string, got {type(v).__name__}"
            )
        if not v:
            raise DatasetError(f"record {number}: field {f!r} is empty")
        out[f] = v
    longest = max(len(out[f].encode()) for f in FIELDS[method][1:])
    size = len(out["prompt"].encode()) + longest
    if size > max_bytes:
        raise DatasetError(f"record {number}: {size} bytes is too long (limit {max_bytes})")
    if method == "dpo" and out["chosen"] == out["rejected"]:
        raise DatasetError(f"record {number}: chosen and rejected are the same")
    return out


def load_records(
    path: str | os.PathLike, method: str, expected: bytes | None, max_bytes: int = MAX_BYTES
) -> list[dict[str, str]]:
    """Every record of a JSONL dataset, validated; raises DatasetError naming the first bad record.

    `expected` is the sha256 from the job spec (None or all zeros: not checked, for local runs).
    """
    if method not in FIELDS:
        raise DatasetError(f"no record format for method {method!r}; known: {', '.join(FIELDS)}")
    data = read_dataset(path, expected)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"dataset {path} is not UTF-8: {exc}") from None
    out = []
    # Split on "\n" only: str.splitlines() would also split inside strings holding U+2028 etc.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise DatasetError(f"record {number}: empty line")
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"record {number}: not JSON ({exc.msg})") from None
        out.append(_check(rec, method, number, max_bytes))
    if len(out) < 2:
        raise DatasetError(f"dataset {path} has {len(out)} records; need >= 2 (train + held-out)")
    return out


def split(recs: list[dict[str, str]], heldout_fraction: float = 0.1) -> tuple[list, list]:
    """(train, held-out): the held-out split is the last fraction of records (at least one)."""
    n_held = max(1, int(len(recs) * heldout_fraction))
    return recs[:-n_held], recs[-n_held:]


def last_letter(n: int, length: int = 4, seed: int = 0, alphabet: str = "abcdef") -> list[Problem]:
    """n problems "last abcd:" -> "d": one-character answers, so a sampled guess is right with
    probability 1/len(alphabet) at the start (dense enough reward for GRPO from scratch)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = "".join(rng.choice(alphabet) for _ in range(length))
        out.append(Problem(f"last {s}:", s[-1]))
    return out
