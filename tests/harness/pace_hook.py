"""Worker hook (loaded by harness.gossip_worker) that paces an honest member: it pauses before
each round (config["pause_s"], default PAUSE_S), as a member training between syncs would, so
that an observer or injector on the topic keeps up with the rounds."""

from __future__ import annotations

import time
from typing import Any

PAUSE_S = 0.15


def before_round(node: Any, r: int, ctx: dict[str, Any]) -> None:
    time.sleep(float(ctx["conf"].get("pause_s", PAUSE_S)))
