"""A libp2p host that only serves and fetches files by sha256: a job's model and dataset.

The caller runs one (`dtrain data serve`, `dtrain job submit --serve`) to hand its files to
the operators, who run one to fetch them (`operator.sources`). It speaks the file protocol of
`files` (docs/protocol.md 5) and nothing else: no gossip, no job topic, no chain. Like
`GossipNode` it runs trio in its own thread behind a synchronous, thread-safe API.

A file is named by a p2p URI: `p2p:<multiaddr>/p2p/<peer id>#sha256=<64 hex>`. The serving
peer's identity is an Ed25519 key kept in a file, so its URIs stay valid across restarts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libp2p import new_host
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from dtrain_node.p2p import files, wire
from dtrain_node.p2p import identity as ident
from dtrain_node.p2p.looper import Looper
from dtrain_node.p2p.metrics import Metrics

DEFAULT_PORT = 4100
DEFAULT_MAX_BYTES = 20 * 10**9  # the largest model pack or dataset a fetcher accepts
P2P_URI = re.compile(
    r"^p2p:(?P<addr>/\S+?/p2p/(?P<peer>[1-9A-HJ-NP-Za-km-z]+))#sha256=(?P<sha>[0-9a-fA-F]{64})$"
)


@dataclass(frozen=True)
class DataConfig:
    listen: str = "/ip4/127.0.0.1/tcp/0"
    request_timeout_s: float = 15.0  # to connect, open a stream, ask and hear the answer
    idle_timeout_s: float = 60.0  # a fetch gives up on a peer silent this long mid-transfer
    file_timeout_s: float = 24 * 3600.0  # serving one file, end to end
    max_file_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        Multiaddr(self.listen)  # raises on a malformed address
        if min(self.request_timeout_s, self.idle_timeout_s, self.file_timeout_s) <= 0:
            raise ValueError("timeouts must be > 0")
        if self.max_file_bytes < 1:
            raise ValueError(f"max_file_bytes must be >= 1, got {self.max_file_bytes}")


@dataclass
class _Dropped:
    dropped: Counter[str] = field(default_factory=Counter)


@dataclass
class _State:
    """What `files.FileService` uses (see files.FileHostState)."""

    config: DataConfig
    metrics: Metrics = field(default_factory=Metrics)
    store: _Dropped = field(default_factory=_Dropped)
    host: Any = None


@dataclass(frozen=True)
class P2PRef:
    """A parsed p2p URI: where to dial, whom, and the sha256 of the bytes to ask for."""

    addr: str  # multiaddr without the /p2p suffix
    peer_key: bytes
    sha256: bytes

    @property
    def peer(self) -> tuple[bytes, list[str]]:
        return self.peer_key, [self.addr]


def p2p_uri(addr: str, peer_id: str, sha256_hex: str) -> str:
    return f"p2p:{addr}/p2p/{peer_id}#sha256={sha256_hex}"


def parse_p2p_uri(uri: str) -> P2PRef:
    """ValueError unless uri is `p2p:<multiaddr>/p2p/<Ed25519 peer id>#sha256=<hex>`."""
    m = P2P_URI.match(uri)
    if m is None:
        raise ValueError(
            f"{uri!r} is not p2p:<multiaddr>/p2p/<peer id>#sha256=<64 hex> "
            "(as `dtrain data serve` prints it)"
        )
    raw = ID.from_base58(m["peer"]).to_bytes()
    if not raw.startswith(ident.PEER_ID_PREFIX) or len(raw) != len(ident.PEER_ID_PREFIX) + 32:
        raise ValueError(f"{uri!r}: peer id {m['peer']} is not an Ed25519 identity")
    addr = m["addr"][: -len("/p2p/" + m["peer"])]
    Multiaddr(addr)  # raises on a malformed address
    return P2PRef(addr, raw[len(ident.PEER_ID_PREFIX) :], bytes.fromhex(m["sha"]))


def load_or_create_key(path: Path) -> bytes:
    """The 32-byte Ed25519 seed in `path`, created (mode 0600) if missing."""
    path = Path(path).expanduser()
    if path.exists():
        seed = path.read_bytes()
        if len(seed) != 32:
            raise ValueError(f"{path}: expected a 32-byte key, found {len(seed)} bytes")
        return seed
    path.parent.mkdir(parents=True, exist_ok=True)
    seed = secrets.token_bytes(32)
    try:  # O_EXCL: two processes racing on one key file must not get different identities
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return load_or_create_key(path)
    with os.fdopen(fd, "wb") as f:
        f.write(seed)
    return seed


def outbound_ip() -> str:
    """This machine's IPv4 address on its default route (no packet is sent); 127.0.0.1
    without one."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only selects the route
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def public_addrs(listen_addrs: list[str], public_ip: str | None = None) -> list[str]:
    """The listen addresses as others dial them: an unspecified IP (0.0.0.0) is replaced by
    public_ip (default: `outbound_ip()`)."""
    out = []
    for a in listen_addrs:
        parts = a.split("/")
        if len(parts) > 2 and parts[1] == "ip4" and ipaddress.ip_address(parts[2]).is_unspecified:
            parts[2] = public_ip or outbound_ip()
        out.append("/".join(parts))
    return out


class DataPeer(Looper):
    """A file-serving/fetching libp2p host; every method is synchronous and thread-safe."""

    thread_name = "data-peer"

    def __init__(self, config: DataConfig | None = None, seed: bytes | None = None) -> None:
        super().__init__()
        self.config = config or DataConfig()
        self._kp = ident.key_pair(seed if seed is not None else secrets.token_bytes(32))
        self.peer_key = ident.peer_key_of(self._kp)
        self.peer_id = ident.peer_id_from_key(self.peer_key)
        self._state = _State(self.config)
        self._files = files.FileService(self._state, self.config.idle_timeout_s)
        self.listen_addrs: list[str] = []

    @classmethod
    def with_key_file(cls, key_file: Path, config: DataConfig | None = None) -> DataPeer:
        return cls(config, load_or_create_key(key_file))

    async def _run(self) -> None:
        host = new_host(key_pair=self._kp)
        self._state.host = host
        async with host.run(listen_addrs=[Multiaddr(self.config.listen)]):
            host.set_stream_handler(TProtocol(wire.CKPT_PROTOCOL), self._files.serve)
            self.listen_addrs = [str(a).split("/p2p/")[0] for a in host.get_transport_addrs()]
            self._ready.set()
            await self._stop.wait()

    # -- files ------------------------------------------------------------------------------
    def serve(self, path: Path | str, sha256_hex: str | None = None, check: bool = True) -> str:
        """Serve the file at path by its sha256 (computed now, or checked against the one
        given unless check=False: just computed); returns it (hex). Every fetcher checks it."""
        path = Path(path)
        if sha256_hex is not None and not check:
            got = files.sha256_bytes(sha256_hex)
        else:
            got = files.sha256_file(path)
        if sha256_hex is not None and got != files.sha256_bytes(sha256_hex):
            raise ValueError(f"{path} has sha256 {got.hex()}, not {sha256_hex}")

        async def add() -> None:
            self._files.add(got, path)

        self._call(add)
        return got.hex()

    def uri(self, sha256_hex: str, public_ip: str | None = None) -> str:
        """The p2p URI of a file we serve, at our first listen address as others dial it."""
        addr = public_addrs(self.listen_addrs, public_ip)[0]
        return p2p_uri(addr, self.peer_id.to_base58(), sha256_hex)

    def fetch(
        self,
        sha256_hex: str,
        peers: list[tuple[bytes, list[str]]],
        dest: Path | str,
        *,
        resume: bool = True,
        progress: files.Progress | None = None,
        max_bytes: int | None = None,
    ) -> Path:
        """Fetch a file by sha256 from the first of peers that delivers it intact, to dest
        (see files.FileService.fetch). CheckpointUnavailable when none does."""
        sha = files.sha256_bytes(sha256_hex)
        return self._call(
            self._files.fetch,
            sha,
            peers,
            Path(dest),
            resume=resume,
            progress=progress,
            max_bytes=max_bytes,
        )

    def fetch_uri(self, uri: str, dest: Path | str, **kw: Any) -> Path:
        ref = parse_p2p_uri(uri)
        return self.fetch(ref.sha256.hex(), [ref.peer], dest, **kw)

    def metrics(self) -> dict[str, Any]:
        st = self._state

        async def snap() -> dict[str, Any]:
            return {
                "bytes_in_total": st.metrics.total_in,
                "bytes_out_total": st.metrics.total_out,
                "dropped": dict(st.store.dropped),
            }

        return self._call(snap)


# -- the caller's side: serve local files and folders ----------------------------------------
DEFAULT_KEY_FILE = Path("~/.dtrain/data-peer.key")
DEFAULT_PACK_DIR = Path("~/.dtrain/cache/sha256")


@dataclass(frozen=True)
class Served:
    """One path being served: the file sent (a folder's pack), its sha256 and its URI."""

    path: Path  # as given
    file: Path  # what is sent: path itself, or the folder's pack
    sha256: str
    uri: str

    @property
    def is_pack(self) -> bool:
        return self.file != self.path


def prepare(path: Path, pack_dir: Path = DEFAULT_PACK_DIR) -> tuple[Path, str]:
    """(the file to send for path, its sha256): a file as it is, a folder packed into
    pack_dir/<sha256> (packs.pack_folder)."""
    from dtrain_node.p2p import packs

    path = Path(path).expanduser()
    if not path.is_dir():
        return path, files.sha256_file(path).hex()
    pack_dir = Path(pack_dir).expanduser()
    tmp = pack_dir / f".pack-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        sha = packs.pack_folder(path, tmp)
        dest = pack_dir / sha
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest, sha


class DataServer:
    """Serves local files and folders to a job's operators until stopped."""

    def __init__(
        self,
        key_file: Path = DEFAULT_KEY_FILE,
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        public_ip: str | None = None,
        pack_dir: Path = DEFAULT_PACK_DIR,
    ) -> None:
        ipaddress.ip_address(host)  # ValueError on a malformed IP
        family = "ip6" if ":" in host else "ip4"
        self.peer = DataPeer.with_key_file(
            key_file, DataConfig(listen=f"/{family}/{host}/tcp/{port}")
        )
        if public_ip is None and ipaddress.ip_address(host).is_loopback:
            public_ip = host
        self.public_ip = public_ip
        self.pack_dir = pack_dir
        self.served: list[Served] = []

    def start(self) -> DataServer:
        self.peer.start()
        return self

    def stop(self) -> None:
        self.peer.stop()

    def __enter__(self) -> DataServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add(self, path: Path | str) -> Served:
        """Serve a file or a folder (as its pack); its URI."""
        file, sha = prepare(Path(path), self.pack_dir)
        self.peer.serve(file, sha, check=False)  # just hashed by prepare
        served = Served(Path(path), file, sha, self.peer.uri(sha, self.public_ip))
        self.served.append(served)
        return served

    def bytes_sent(self) -> int:
        return int(self.peer.metrics()["bytes_out_total"])


def is_local(uri: str) -> bool:
    """A reference to a file or folder on this machine (not builtin:, hf://, p2p: or http)."""
    if not uri or uri.startswith(("builtin:", "hf://", "p2p:", "https://", "http://")):
        return False
    return Path(uri.removeprefix("file://")).expanduser().exists()


def serve_job_files(
    server: DataServer, model_uri: str, dataset_uri: str, recipe_uri: str
) -> tuple[str, str, str]:
    """Serve each of a job's references that is local; the references to put in the job
    (p2p URIs for those, the others unchanged)."""
    out = []
    for uri in (model_uri, dataset_uri, recipe_uri):
        out.append(server.add(Path(uri.removeprefix("file://"))).uri if is_local(uri) else uri)
    return out[0], out[1], out[2]


@contextlib.contextmanager
def stop_signals() -> Iterator[threading.Event]:
    """An event SIGINT and SIGTERM set while inside (the previous handlers are restored)."""
    import signal

    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_until(
    done: Callable[[], str | None], poll_s: float = 2.0, stop: threading.Event | None = None
) -> str:
    """Block until SIGINT/SIGTERM ("interrupted"; or `stop` is set, from `stop_signals`) or
    until done() returns a reason, asked every poll_s seconds; the reason."""
    if stop is None:
        with stop_signals() as stop:
            return serve_until(done, poll_s, stop)
    while not stop.wait(poll_s):
        reason = done()
        if reason is not None:
            return reason
    return "interrupted"
