"""A member's private state (`reproduce.private_state`: error feedback, inner AdamW moments
(none in paper mode), step count) as one canonical file, so that its sha256 is the commitment
a member signs per round and the file travels by that sha256 over the p2p file protocol
(docs/protocol.md 4.6).

One state has one encoding (tensors in ascending name order, nothing optional), so the sha256
of the file is a commitment to the state. The inner optimizer's hyper-parameters are not in
it: a checker replays with the job's recipe, never with what the member claims.

Layout (big-endian integers; tensor bytes little-endian, row-major):

    magic "DTPS", version 1, steps u64, layout length u16, layout (ASCII: the error feedback's
    layout tag), tensors u32, then per tensor, names strictly ascending:
    name length u8, name (ASCII), dtype u8 (DTYPES), ndim u8 (<= 8), dims u32 x ndim, bytes

Names: `e.mat`, `e.vec` (the error feedback), `inner.<index, 8 digits>.<key>` (AdamW's
per-parameter state: `exp_avg`, `exp_avg_sq`, `step`). `decode` refuses anything else with
`StateInvalid`; `load` also refuses a state whose shapes do not fit the checker's model.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

import torch

from dtrain_node.optim import reproduce
from dtrain_node.optim.optimizer import DeMo

MAGIC = b"DTPS"
VERSION = 1
_HEAD = struct.Struct(">4sBQH")
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32)
_CODE = {d: i for i, d in enumerate(DTYPES)}
MAX_NDIM = 8
MAX_TENSORS = 1 << 20
INNER_KEYS = frozenset({"exp_avg", "exp_avg_sq", "step"})


class StateInvalid(ValueError):
    """A private-state file that does not decode, or does not fit the model."""


def _names(state: reproduce.PrivateState) -> dict[str, torch.Tensor]:
    out = {"e.mat": state["e"]["mat"], "e.vec": state["e"]["vec"]}
    for index, slot in state["inner"]["state"].items():
        for key, value in slot.items():
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value)
            out[f"inner.{int(index):08d}.{key}"] = value
    return out


def encode(state: reproduce.PrivateState) -> bytes:
    """The canonical file of `state` (as `reproduce.private_state` returns it)."""
    layout = str(state["e"]["layout"]).encode("ascii")
    tensors = _names(state)
    out = [_HEAD.pack(MAGIC, VERSION, int(state["steps"]), len(layout)), layout]
    out.append(struct.pack(">I", len(tensors)))
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _CODE:
            raise ValueError(f"{name}: dtype {t.dtype} has no code")
        raw = name.encode("ascii")
        out.append(bytes([len(raw)]) + raw)
        out.append(struct.pack(">BB", _CODE[t.dtype], t.dim()))
        out.append(struct.pack(f">{t.dim()}I", *t.shape))
        out.append(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return b"".join(out)


def _entry_bytes(name: str, shape: Sequence[int], dtype: torch.dtype) -> int:
    numel = 1
    for d in shape:
        numel *= d
    return 1 + len(name) + 2 + 4 * len(shape) + numel * torch.empty((), dtype=dtype).element_size()


def size_bound(opt: DeMo) -> int:
    """The most bytes a private state of `opt`'s model and recipe encodes to: its error
    feedback, and a full inner AdamW state (every parameter's moments and step count). Every
    node of a job computes the same bound, the cap on a state fetch and the size its deadline
    is sized from (`replaycheck.state_deadline`)."""
    e = opt.feedback.state()
    size = _HEAD.size + len(str(e["layout"]).encode("ascii")) + 4
    size += sum(_entry_bytes(f"e.{k}", e[k].shape, e[k].dtype) for k in ("mat", "vec"))
    if opt.inner is None:
        return size
    params = [p for group in opt.inner.param_groups for p in group["params"]]
    for i, p in enumerate(params):
        for key in ("exp_avg", "exp_avg_sq"):
            size += _entry_bytes(f"inner.{i:08d}.{key}", p.shape, p.dtype)
        size += _entry_bytes(f"inner.{i:08d}.step", (), torch.float32)
    return size


def commitment(data: bytes) -> bytes:
    """What a member signs per round: the sha256 of its private-state file."""
    return hashlib.sha256(data).digest()


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise StateInvalid(f"truncated: {what} needs {n} bytes at offset {self.at}")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        s = struct.Struct(fmt)
        return s.unpack(self.take(s.size, what))


def _tensor(rd: _Reader, name: str) -> torch.Tensor:
    code, ndim = rd.unpack(">BB", f"{name}'s dtype")
    if code >= len(DTYPES) or ndim > MAX_NDIM:
        raise StateInvalid(f"{name}: dtype code {code}, {ndim} dims")
    shape = rd.unpack(f">{ndim}I", f"{name}'s shape")
    dtype = DTYPES[code]
    numel = 1
    for d in shape:
        numel *= d
    size = numel * torch.empty((), dtype=dtype).element_size()
    raw = bytearray(rd.take(size, f"{name}'s bytes"))
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(shape)


def _place(state: reproduce.PrivateState, name: str, t: torch.Tensor) -> None:
    if name in ("e.mat", "e.vec"):
        state["e"][name[2:]] = t
        return
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "inner" or len(parts[1]) != 8 or not parts[1].isdigit():
        raise StateInvalid(f"unknown tensor {name!r}")
    if parts[2] not in INNER_KEYS:
        raise StateInvalid(f"unknown inner state {parts[2]!r}")
    state["inner"]["state"].setdefault(int(parts[1]), {})[parts[2]] = t


def decode(data: bytes) -> reproduce.PrivateState:
    """Parse a private-state file; raise StateInvalid (never anything else) if malformed.
    The result has no `param_groups` (see `load`)."""
    if len(data) < _HEAD.size + 4:
        raise StateInvalid(f"{len(data)} bytes: shorter than a header")
    magic, version, steps, n = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise StateInvalid(f"magic {magic!r} version {version}")
    rd = _Reader(data)
    rd.at = _HEAD.size
    try:
        layout = rd.take(n, "layout").decode("ascii")
    except UnicodeDecodeError:
        raise StateInvalid("layout is not ASCII") from None
    state: reproduce.PrivateState = {
        "e": {"layout": layout},
        "inner": {"state": {}},
        "steps": steps,
    }
    (count,) = rd.unpack(">I", "tensor count")
    if count > MAX_TENSORS:
        raise StateInvalid(f"{count} tensors > {MAX_TENSORS}")
    last = b""
    for _ in range(count):
        (size,) = rd.unpack(">B", "name length")
        raw = rd.take(size, "name")
        if raw <= last or not raw.isascii():
            raise StateInvalid(f"tensor names not strictly ascending ASCII at {raw!r}")
        last = raw
        name = raw.decode("ascii")
        _place(state, name, _tensor(rd, name))
    if rd.at != len(data):
        raise StateInvalid(f"{len(data) - rd.at} bytes after the last tensor")
    if "mat" not in state["e"] or "vec" not in state["e"]:
        raise StateInvalid("no error feedback")
    return state


def _check_inner(opt: DeMo, slots: dict[int, dict[str, Any]]) -> None:
    params = list(opt.params)
    if sorted(slots) != list(range(len(slots))) or len(slots) not in (0, len(params)):
        raise StateInvalid(f"inner state for {len(slots)} tensors, the model has {len(params)}")
    for i, slot in slots.items():
        if set(slot) != INNER_KEYS:
            raise StateInvalid(f"inner state {i} holds {sorted(slot)}")
        shape = tuple(params[i].shape)
        for key in ("exp_avg", "exp_avg_sq"):
            if tuple(slot[key].shape) != shape or not slot[key].is_floating_point():
                raise StateInvalid(f"inner {i}.{key}: {tuple(slot[key].shape)}, want {shape}")
        if slot["step"].dim() != 0:
            raise StateInvalid(f"inner {i}.step has shape {tuple(slot['step'].shape)}")


def load(opt: DeMo, shared: Sequence[torch.Tensor], state: reproduce.PrivateState) -> None:
    """`reproduce.load_state` of a decoded state, with the checker's own inner-optimizer
    hyper-parameters (the job's recipe); StateInvalid if it does not fit `opt`'s model."""
    if opt.inner is None and state["inner"]["state"]:
        raise StateInvalid("paper mode has no inner optimizer: the state holds AdamW moments")
    _check_inner(opt, state["inner"]["state"])
    groups = [] if opt.inner is None else opt.inner.state_dict()["param_groups"]
    full = {**state, "inner": {"state": state["inner"]["state"], "param_groups": groups}}
    try:
        reproduce.load_state(opt, shared, full)
    except (ValueError, KeyError, RuntimeError) as e:
        raise StateInvalid(f"does not fit the model: {e}") from None
