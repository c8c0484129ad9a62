"""A data peer process serving files by sha256: argv[1] is JSON {"key_file", "files": [path],
"lies": {sha256 hex: path}} ("lies": a file served under a hash it does not have).

Prints {"event": "ready", "uris": {path or sha: uri}, "peer_id"} and serves until a line
arrives on stdin, then prints {"event": "done", "bytes_out"} and exits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dtrain_node.p2p.dataserve import DataConfig, DataPeer


def main() -> int:
    conf = json.loads(Path(sys.argv[1]).read_text())
    peer = DataPeer.with_key_file(
        Path(conf["key_file"]), DataConfig(listen=conf.get("listen", "/ip4/127.0.0.1/tcp/0"))
    )
    with peer:
        uris = {}
        for path in conf.get("files", []):
            uris[path] = peer.uri(peer.serve(path))
        for sha, path in conf.get("lies", {}).items():
            uris[sha] = peer.uri(peer.serve(path, sha, check=False))
        ready = {"event": "ready", "uris": uris, "peer_id": peer.peer_id.to_base58()}
        print(json.dumps(ready), flush=True)
        sys.stdin.readline()
        print(json.dumps({"event": "done", **peer.metrics()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
