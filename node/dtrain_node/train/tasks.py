"""Offline tasks with checkable answers, written as the JSONL dataset files of SFT, DPO and GRPO:
  sft:  {"prompt": str, "completion": str}
  dpo:  {"prompt": str, "chosen": str, "rejected": str}
  grpo: {"prompt": str, "answer": str}
Reading them back (`load_records`, `split`) is dataset.py's, re-exported here: it checks the
file's sha256 and validates every line before training starts (docs/methods.md "Data formats").
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import string
from dataclasses import dataclass
from pathlib import Path

from dtrain_node.train.dataset import check_dataset, load_records, split

METHODS = ("sft", "dpo", "grpo")


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


def _distinct_strings(n: int, length: int, alphabet: str, seed: int) -> list[str]:
    """min(n, len(alphabet) ** length) distinct strings, drawn without replacement, shuffled."""
    k = len(alphabet)
    if k < 2 or len(set(alphabet)) != k or length < 1:
        raise ValueError(
            f"need >= 2 distinct alphabet characters and length >= 1, got {alphabet!r}"
        )
    codes = random.Random(seed).sample(range(k**length), min(n, k**length))
    return ["".join(alphabet[c // k**i % k] for i in range(length)) for c in codes]


def reversal(n: int, length: int = 4, seed: int = 0, alphabet: str = "abcdef") -> list[Problem]:
    """n distinct problems "rev abcd:" -> "dcba" over a small alphabet, shuffled.

    Distinct prompts, so any split of them into train and held-out is disjoint. n is capped at
    the number of distinct problems (len(alphabet) ** length).
    """
    return [Problem(f"rev {s}:", s[::-1]) for s in _distinct_strings(n, length, alphabet, seed)]


_PRINTABLE = string.ascii_letters + string.digits + string.punctuation
_CLASSES = (str.isdigit, str.islower, str.isupper)
_POOLS = (string.digits, string.ascii_lowercase, string.ascii_uppercase)


def _pool(c: str) -> str:
    """The characters of c's class (digits, lowercase, uppercase; else printable ASCII)."""
    return next((pool for test, pool in zip(_CLASSES, _POOLS, strict=True) if test(c)), _PRINTABLE)


def _replacements(p: Problem, i: int, alphabet: str) -> list[str]:
    """Characters to put at answer position i instead of its own: of the same class, and in the
    prompt exactly when the replaced character is (so "has a character the prompt lacks" is the
    same for the right and the wrong answer); preferably from the dataset's answer `alphabet`."""
    c = p.answer[i]
    same = set(_pool(c)) - {c}
    status = same & set(p.prompt) if c in p.prompt else same - set(p.prompt)
    if not status:
        status = same  # e.g. "0+0=" -> "0": no other digit in the prompt
    preferred = status & set(alphabet)
    return sorted(preferred or status)


def _plausible(wrong: str, answer: str) -> bool:
    """A wrong number has no leading zero unless the answer has one (no "01" for "10")."""
    return not (answer.isdigit() and len(wrong) > 1 and wrong[0] == "0" != answer[0])


def wrong_answer(p: Problem, rng: random.Random, alphabet: str = "") -> str:
    """A plausible wrong answer of the same width that no surface feature gives away.

    Two different characters of the answer swapped (the same characters in a wrong order); for
    an answer of one repeated character, one character replaced by another of its class (digits
    stay digits) that is in the prompt exactly when the replaced one is. So a heuristic such as
    "the answer with a character the prompt lacks is the rejected one" scores chance.
    """
    a = p.answer
    swaps = {
        a[:i] + a[j] + a[i + 1 : j] + a[i] + a[j + 1 :]
        for i in range(len(a))
        for j in range(i + 1, len(a))
        if a[i] != a[j]
    }
    cands = sorted(w for w in swaps if _plausible(w, a))
    if not cands:
        subs = {
            a[:i] + c + a[i + 1 :] for i in range(len(a)) for c in _replacements(p, i, alphabet)
        }
        cands = sorted(w for w in subs if _plausible(w, a)) or sorted(subs)
    return rng.choice(cands)


def records(problems: list[Problem], method: str, seed: int = 0) -> list[dict[str, str]]:
    if method == "sft":
        return [{"prompt": p.prompt, "completion": p.answer} for p in problems]
    if method == "dpo":
        rng = random.Random(seed)
        alphabet = "".join(sorted({c for p in problems for c in p.answer}))
        return [
            {"prompt": p.prompt, "chosen": p.answer, "rejected": wrong_answer(p, rng, alphabet)}
            for p in problems
        ]
    if method == "grpo":
        return [{"prompt": p.prompt, "answer": p.answer} for p in problems]
    raise ValueError(f"no record format for method {method!r}; known: {', '.join(METHODS)}")


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


def last_letter(n: int, length: int = 4, seed: int = 0, alphabet: str = "abcdef") -> list[Problem]:
    """n distinct problems "last abcd:" -> "d": one-character answers, so a sampled guess is right
    with probability 1/len(alphabet) at the start (dense enough reward for GRPO from scratch).

    Distinct prompts (n is capped at len(alphabet) ** length), shuffled.
    """
    return [Problem(f"last {s}:", s[-1]) for s in _distinct_strings(n, length, alphabet, seed)]


__all__ = [
    "Problem",
    "addition",
    "check_dataset",
    "last_letter",
    "load_records",
    "make_dataset",
    "records",
    "reversal",
    "split",
    "write_jsonl",
    "wrong_answer",
]
