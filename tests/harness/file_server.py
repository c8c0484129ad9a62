"""A gossip node process that serves files: argv[1] is JSON {"data_dir", "files": {sha: path}}
(and "stall": true for a server with fault `stall`: "found", then nothing; "drip": true for
fault `drip`: its private-state files, `*.dtps`, one byte per 55 s).

Prints {"event": "ready", "peer_key", "addrs"} and serves until a line arrives on stdin.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eth_account import Account

from dtrain_node.p2p.host import GossipConfig, GossipNode
from harness.gossip_cluster import CHAIN_ID, CONTRACT, JOB_ID


def main() -> int:
    conf = json.loads(Path(sys.argv[1]).read_text())
    cfg = GossipConfig(
        Path(conf["data_dir"]),
        CHAIN_ID,
        CONTRACT,
        JOB_ID,
        stall_files=conf.get("stall", False),
        drip_states=conf.get("drip", False),
    )
    with GossipNode(cfg, Account.create()) as node:
        for sha, path in conf["files"].items():
            node.serve_file(sha, path)
        print(
            json.dumps(
                {"event": "ready", "peer_key": node.peer_key.hex(), "addrs": node.listen_addrs}
            ),
            flush=True,
        )
        sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
