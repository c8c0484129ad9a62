"""Held-out offline corpus: text in a synthetic language generated from a seed (no files, no
network, the same bytes on every machine: only `random.Random` with string seeds).

The benchmarks' defaults (sync interval, top-k, bits, error-feedback decay, learning rates) are
never chosen on this corpus: it is only reported, next to the code and prose corpora the
defaults were measured on, to show what a setting does on text nobody tuned it to. Do not
tune to it.

The language: a lexicon of pseudo-words built from syllables (nouns, verbs, adjectives,
adverbs, prepositions, names), drawn with Zipf frequencies; nouns have a plural suffix, verbs
agree with their subject's number (also across a relative clause) and carry the document's
tense; sentences come from a small probabilistic grammar with relative clauses, prepositional
phrases and coordination. A document has a title, a topic (a set of nouns it favours), named
characters introduced in its first sentence and referred to later, and sometimes a ledger of
`item: count` lines closed by their `total:` (a sum a model can learn only in part). Training
and held-out documents are separate random streams over the same lexicon.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch

ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr",
          "kl", "br", "sh", "th", "gr", "pl")  # fmt: skip
VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ee")
CODAS = ("", "", "", "n", "r", "l", "s", "k", "m", "nd", "rt")


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(
        rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables)
    )


@dataclass(frozen=True)
class Lexicon:
    nouns: tuple[str, ...]
    verbs: tuple[str, ...]
    adjectives: tuple[str, ...]
    adverbs: tuple[str, ...]
    preps: tuple[str, ...]
    names: tuple[str, ...]


def lexicon(seed: int) -> Lexicon:
    """Distinct pseudo-words per class, in Zipf rank order."""
    rng, seen = random.Random(f"heldout:{seed}:lexicon"), set()

    def words(n: int, lo: int, hi: int) -> tuple[str, ...]:
        out: list[str] = []
        while len(out) < n:
            w = _word(rng, rng.randint(lo, hi))
            if w not in seen and len(w) > 1:
                seen.add(w)
                out.append(w)
        return tuple(out)

    return Lexicon(
        nouns=words(600, 1, 3),
        verbs=words(300, 1, 3),
        adjectives=words(200, 1, 3),
        adverbs=tuple(w + "ly" for w in words(60, 1, 2)),
        preps=words(12, 1, 1),
        names=tuple(w.capitalize() for w in words(120, 2, 3)),
    )


def _zipf(n: int) -> list[float]:
    return list(itertools.accumulate(1 / (i + 1) ** 1.1 for i in range(n)))


class Writer:
    """Documents of one random stream over a lexicon."""

    def __init__(self, lex: Lexicon, rng: random.Random) -> None:
        self.lex, self.rng = lex, rng
        self.cum = {k: _zipf(len(getattr(lex, k))) for k in ("nouns", "verbs", "adjectives")}
        self.topic: tuple[str, ...] = ()
        self.cast: tuple[str, ...] = ()
        self.past = False

    def pick(self, kind: str) -> str:
        words = getattr(self.lex, kind)
        return self.rng.choices(words, cum_weights=self.cum[kind])[0]

    def noun(self, plural: bool) -> str:
        n = self.rng.choice(self.topic) if self.rng.random() < 0.5 else self.pick("nouns")
        return (n + ("en" if n[-1] not in "aeiou" else "n")) if plural else n

    def verb(self, plural: bool) -> str:
        v = self.pick("verbs") + ("o" if plural else "a")
        return "ge" + v if self.past else v

    def np(self, depth: int) -> tuple[str, bool]:
        r = self.rng
        if self.cast and r.random() < 0.15:
            return r.choice(self.cast), False
        plural = r.random() < 0.4
        det = r.choice(("the", "some", "many", "no") if plural else ("the", "a", "every", "one"))
        words = [det]
        if r.random() < 0.3:
            words.append(self.pick("adjectives"))
        words.append(self.noun(plural))
        if depth < 2 and r.random() < 0.2:
            words += [r.choice(self.lex.preps), self.np(depth + 1)[0]]
        if depth < 2 and r.random() < 0.15:  # agreement across the clause
            words += ["that", self.vp(plural, depth + 1)]
        return " ".join(words), plural

    def vp(self, plural: bool, depth: int) -> str:
        r = self.rng
        if r.random() < 0.15:
            be = ("wero" if plural else "wera") if self.past else ("aro" if plural else "isa")
            return f"{be} {self.pick('adjectives')}"
        words = [self.verb(plural), self.np(depth + 1)[0]]
        if r.random() < 0.2:
            words.append(r.choice(self.lex.adverbs))
        return " ".join(words)

    def clause(self, depth: int = 0) -> str:
        subject, plural = self.np(depth)
        out = f"{subject} {self.vp(plural, depth)}"
        r = self.rng.random()
        if depth < 1 and r < 0.15:
            return f"{out}, and {self.clause(depth + 1)}"
        if depth < 1 and r < 0.25:
            return f"when {out}, {self.clause(depth + 1)}"
        return out

    def sentence(self) -> str:
        s = self.clause()
        return s[0].upper() + s[1:] + self.rng.choice((".", ".", ".", "!"))

    def ledger(self) -> str:
        items = [(self.noun(True), self.rng.randint(1, 40)) for _ in range(self.rng.randint(2, 6))]
        lines = [f"- {n}: {c}" for n, c in items]
        return "ledger:\n" + "\n".join(lines) + f"\ntotal: {sum(c for _, c in items)}\n\n"

    def document(self) -> str:
        r, lex = self.rng, self.lex
        self.topic = tuple(r.sample(lex.nouns, 30))
        self.cast = tuple(r.sample(lex.names, r.randint(1, 3)))
        self.past = r.random() < 0.5
        title = " ".join(w.capitalize() for w in (self.pick("adjectives"), self.topic[0]))
        intro = " ".join(
            f"{name} {'wera' if self.past else 'isa'} a {self.pick('adjectives')} "
            f"{self.noun(False)}."
            for name in self.cast
        )
        paras = [intro] + [
            " ".join(self.sentence() for _ in range(r.randint(3, 6)))
            for _ in range(r.randint(2, 5))
        ]
        body = f"= {title} =\n\n" + "\n\n".join(paras) + "\n\n"
        return body + (self.ledger() if r.random() < 0.3 else "")


def generate(seed: int, stream: str, max_bytes: int) -> bytes:
    """Whole documents of one stream ("train" or "heldout") up to max_bytes (the last cut)."""
    w = Writer(lexicon(seed), random.Random(f"heldout:{seed}:{stream}"))
    out, n = [], 0
    while n < max_bytes:
        doc = w.document().encode("ascii")
        out.append(doc)
        n += len(doc)
    return b"".join(out)[:max_bytes]


def heldout_corpus(
    max_train: int = 4_000_000, max_heldout: int = 400_000, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, heldout) int64 byte tensors of the synthetic language of `seed`."""
    t = torch.frombuffer(bytearray(generate(seed, "train", max_train)), dtype=torch.uint8)
    h = torch.frombuffer(bytearray(generate(seed, "heldout", max_heldout)), dtype=torch.uint8)
    return t.long(), h.long()
