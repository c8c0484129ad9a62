"""Replay spot checks, the parts without training (docs/protocol.md 4.6): who checks whom in a
round, and the ring of private states a member keeps so that it can be checked.

**Assignment.** After round r every honest member holds the same shared state; its sha256
(`shared_digest`) seeds the round's checks (`assign`): each member is checked with probability
`rate`, by another member drawn from the same hash. Nobody knows the seed while it trains and
commits round r (it depends on every member's packet of the round, each committed before any
was revealed), and nobody sets it alone.

**Retention.** Per round a member writes its private state at the round's start as a canonical
file (`statefile`) whose sha256 it signs into its commitment, serves it by that sha256 over
the p2p file protocol, and keeps every round's file of the attempt until its next attempt
begins (`StateRing`), which is after the attempt's challenge window closed: a checker that
fell behind, or a referee, still finds every state the member committed to. A state the
checker could not fetch is never a claim (absence is not guilt): the check is undecided.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from eth_utils import to_checksum_address

DEFAULT_RATE = 0.09  # docs/protocol.md 4.6: a 50-round cheater is caught w.p. 1 - 0.91^50
RATE_ENV = "DTRAIN_SPOT_CHECK_RATE"
KEEP_ROUNDS = None  # private states a member keeps per attempt: all of them (None)
_DOMAIN = b"dtrain/spot-check/1"


def rate_from_env(default: float = DEFAULT_RATE) -> float:
    """The check rate: `DTRAIN_SPOT_CHECK_RATE` (0 turns checks off), else `default`."""
    raw = os.environ.get(RATE_ENV)
    rate = default if raw is None or raw == "" else float(raw)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{RATE_ENV}={raw!r} not in [0, 1]")
    return rate


def shared_digest(shared: Sequence[torch.Tensor]) -> bytes:
    """sha256 of the shared state (every honest member computes the same bytes)."""
    h = hashlib.sha256(b"dtrain/shared-state/1")
    for t in shared:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


def assign(seed: bytes, members: Sequence[str], rnd: int, rate: float) -> list[tuple[str, str]]:
    """The checks of round `rnd` as (checker, member) pairs, a pure function of the seed (the
    shared state's digest after the round), the members and the rate: member m is checked
    when the first 8 bytes of sha256(domain || seed || round || m) fall under rate x 2^64, by
    the member of the others (ascending addresses) the next 8 bytes pick. Never itself."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate {rate} not in [0, 1]")
    ordered = sorted({to_checksum_address(m) for m in members}, key=str.lower)
    if len(ordered) < 2:
        return []
    bound = int(rate * 2**64)
    out = []
    for m in ordered:
        raw = bytes.fromhex(m[2:])
        h = hashlib.sha256(_DOMAIN + seed + rnd.to_bytes(8, "big") + raw).digest()
        if int.from_bytes(h[:8], "big") < bound:
            others = [o for o in ordered if o != m]
            out.append((others[int.from_bytes(h[8:16], "big") % len(others)], m))
    return out


_NAME = re.compile(r"^(\d+)-(\d+)-([0-9a-f]{64})\.dtps$")


class StateRing:
    """The private-state files of one member's epoch attempt in `<job_dir>/states/`, named
    `<attempt>-<round>-<sha256>.dtps`: kept and served (`serve`: sha256 hex, path), other
    attempts' deleted; with `keep`, only the last `keep` rounds' (a bound for tools, not the
    protocol's: members keep every round until the challenge window closed)."""

    def __init__(
        self,
        job_dir: Path,
        attempt: int,
        serve: Callable[[str, Path], None],
        keep: int | None = KEEP_ROUNDS,
    ) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir = Path(job_dir) / "states"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.attempt, self.keep, self._serve = attempt, keep, serve
        for rnd, sha, path in self.files():  # a restarted member serves what it kept
            if rnd >= 0:
                serve(sha, path)

    def files(self) -> list[tuple[int, str, Path]]:
        """(round, sha256 hex, path) of this attempt's files, by round; other attempts' as
        round -1."""
        out = []
        for p in self.dir.iterdir():
            m = _NAME.match(p.name)
            if m:
                rnd = int(m[2]) if int(m[1]) == self.attempt else -1
                out.append((rnd, m[3], p))
        return sorted(out)

    def put(self, rnd: int, data: bytes) -> str:
        """Keep (fsync), serve and return the sha256 hex of round `rnd`'s state file; prune."""
        sha = hashlib.sha256(data).hexdigest()
        path = self.dir / f"{self.attempt}-{rnd}-{sha}.dtps"
        if not path.is_file():
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        self._serve(sha, path)
        self.prune(rnd)
        return sha

    def prune(self, rnd: int) -> None:
        """Delete other attempts' files and, with `keep`, this attempt's before the last `keep`
        rounds up to `rnd`."""
        floor = -1 if self.keep is None else rnd - self.keep
        for r, _, path in self.files():
            if r < 0 or r <= floor:
                path.unlink(missing_ok=True)
