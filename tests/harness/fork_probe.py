"""Child for tests/integration/test_forks.py: prints what a fresh interpreter would differ in
(JSON on one line), then waits for one stdin line and exits with the code it names."""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
import torch

print(
    json.dumps(
        {
            "pid": os.getpid(),
            "sid": os.getsid(0),
            "argv": sys.argv[1:],
            "probe": os.environ.get("PROBE"),
            "cwd": os.getcwd(),
            "draw": int(np.random.randint(0, 2**31)),
            "threads": torch.get_num_threads(),
            "nice": os.nice(0),
            "sigpipe_ignored": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
        }
    ),
    flush=True,
)
line = sys.stdin.readline()
print("stderr line", file=sys.stderr)
sys.exit(int(line) if line.strip() else 0)
