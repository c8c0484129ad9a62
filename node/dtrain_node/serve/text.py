"""Generated token ids to text as it streams: stop strings cut the text (the stop itself is not
returned), and nothing is emitted that a later token could still change (the start of a stop
string, a UTF-8 character whose bytes have not all arrived)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

PARTIAL_CHAR = "\ufffd"  # what decoding shows for a character missing some of its bytes


class StopText:
    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str]) -> None:
        self._decode = decode
        self._stops = tuple(s for s in stops if s)
        self._ids: list[int] = []
        self._sent = 0  # characters of the text already emitted
        self.stopped = False

    def push(self, token: int) -> str:
        """The text newly settled by `token`; sets `stopped` when a stop string appeared."""
        self._ids.append(token)
        text = self._decode(self._ids)
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._emit(text[:cut])
        return self._emit(text[: len(text) - self._held(text)])

    def flush(self) -> str:
        """The rest of the text, once generation has ended without a stop string."""
        return "" if self.stopped else self._emit(self._decode(self._ids))

    def _emit(self, text: str) -> str:
        delta = text[self._sent :]
        self._sent = max(self._sent, len(text))
        return delta

    def _held(self, text: str) -> int:
        """Characters at the end of `text` that must wait: a partial character, or the longest
        tail that begins a stop string."""
        partial = len(text) - len(text.rstrip(PARTIAL_CHAR))
        prefix = max(
            (n for s in self._stops for n in range(1, len(s)) if text.endswith(s[:n])),
            default=0,
        )
        return max(partial, prefix)
