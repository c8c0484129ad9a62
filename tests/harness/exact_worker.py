"""Subprocess helper for the thread-count exactness test.

usage: python -m harness.exact_worker THREADS ORDER_SEED
  -> prints the aggregate digest and the sha256
of the float32 update bytes (plain, then the robust rule's weighted mean).
Packets are generated deterministically from fixed seeds.
"""

import hashlib
import random
import sys

import torch


def packets():
    from dtrain_node.optim.codec import Spec, decode, encode
    from dtrain_node.optim.compress import CompressConfig, compress

    cfg = CompressConfig(k2d=16, k1d=2, bits=2)
    shapes = [("w1", (1024, 768)), ("w2", (640, 330)), ("b", (1000,)), ("s", ())]
    spec = Spec(tuple(n for n, _ in shapes), tuple(s for _, s in shapes), cfg)
    out = []
    for sender in range(6):
        g = torch.Generator().manual_seed(100 + sender)
        # senders at different scales, so exponents must be aligned
        ts = [compress(torch.randn(s, generator=g) * 4.0**sender, cfg) for _, s in shapes]
        out.append((f"0x{sender:040x}", decode(spec, encode(spec, ts))))
    return spec, out


def main() -> None:
    threads, order_seed = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    from dtrain_node.optim.aggregate import aggregate
    from dtrain_node.optim.robust import RobustConfig, screen_weighted

    spec, pk = packets()
    random.Random(order_seed).shuffle(pk)
    agg = aggregate(spec, pk)
    h = hashlib.sha256()
    for i in range(len(spec.names)):
        for sign in (False, True):
            h.update(agg.update(i, 3e-3, sign).numpy().tobytes())
    # the rule's weighted mean: bound, trust shifts and the divisor, the same bits everywhere
    kept, _, _, weight = screen_weighted(spec, pk, RobustConfig(trust_shift=8, weighted=True))[:4]
    robust = aggregate(spec, kept)
    robust.weight = weight
    h.update(robust.digest().encode())
    for i in range(len(spec.names)):
        h.update(robust.update(i, 3e-3, False).numpy().tobytes())
    print(torch.get_num_threads(), agg.digest(), h.hexdigest())


if __name__ == "__main__":
    main()
