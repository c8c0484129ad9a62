"""Our ask per payment unit as the chain holds it: `--min-price` sets the ether one at start,
and `--auto` takes a job only at or above our ask in the job's own unit."""

from __future__ import annotations

from dtrain.client import BSM
from dtrain.models import Job, Operator


def sync_ether_ask(bsm: BSM, op: Operator, wanted: int | None) -> int | None:
    """Sets our registered ask in ether to `wanted` (None: keep the chain's) when it differs;
    returns the ask it replaced, or None when nothing changed."""
    if wanted is None or not op.registered or op.min_price_per_epoch == wanted:
        return None
    bsm.update_ask(wanted)
    return op.min_price_per_epoch


def ask_in(bsm: BSM, me: str, token: str | None, registering_ask: int) -> int | None:
    """Our ask in `token` (None: ether), None when we take no job in it: the chain's once we
    are registered; before, the ask in ether we register with, and in a token any price only
    if that ask is 0 (the contract's rule for a token without an ask of its own)."""
    if bsm.operator(me).registered:
        return bsm.ask_in(me, token)
    if token is None:
        return registering_ask
    return 0 if registering_ask == 0 else None


def pays_our_ask(bsm: BSM, me: str, job: Job, registering_ask: int) -> bool:
    """Whether `job`'s price reaches our ask in the unit it pays in."""
    ask = ask_in(bsm, me, bsm.job_token(job.id), registering_ask)
    return ask is not None and job.spec.price_per_operator_epoch >= ask
