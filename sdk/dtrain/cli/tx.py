"""Commands that send one transaction (`operator stake`, `stake delegate`, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from ..client import BSM
from ..units import format_eth, format_time
from .root import AMOUNT, Ctx, emit, pass_ctx


@dataclass(frozen=True)
class TxCommand:
    """`dtrain GROUP NAME ARGS...`: one transaction, `BSM.<method>(*args)`, then one line."""

    group: click.Group
    name: str
    args: str  # argument names in order, from TX_ARGS
    done: str  # printed, formatted with the arguments (amounts in ETH)
    method: str = ""  # the BSM method; default: the command's name

    def register(self) -> None:
        def send(ctx: Ctx, **kw: Any) -> None:
            values = [kw[a] for a in self.args.split()]
            rc = getattr(ctx.bsm(), self.method or self.name)(*values)
            shown = {k: format_eth(v) if k == "amount" else v for k, v in kw.items()}
            human, data = self.done.format(**shown), {"tx": rc.tx_hash}
            for e in rc.all("UnbondingQueued"):
                data["unlock_at"] = e.args["unlockAt"]
                human += (
                    f"; withdrawable from {format_time(e.args['unlockAt'])} with "
                    f"`dtrain stake withdraw {e.args['operator']}` (slashable until then)"
                )
            for e in rc.all("Staked"):
                earns = _earns_from(ctx.bsm(), e.args["operator"])
                data["earns_from"] = earns
                if earns:
                    human += (
                        f"; the operator is in a job, so this stake earns rewards from "
                        f"{format_time(earns)} (stake earns only for epochs it was present for "
                        "from their start; it is slashable at once)"
                    )
            emit(ctx, data, human)

        command = pass_ctx(send)
        for a in reversed(self.args.split()):
            command = TX_ARGS[a](command)
        self.group.command(self.name, help=TX_HELP[self.name])(command)


def _earns_from(bsm: BSM, operator: str) -> int:
    """When stake added to `operator`'s pool now starts earning: 0 (at once) when the operator is
    in no job, else the start of the second reward period after this one (the contract's rule)."""
    if bsm.operator(operator).active_jobs == 0:
        return 0
    period = bsm.reward_period()
    return (bsm.latest_block_timestamp() // period + 2) * period


TX_ARGS = {
    "amount": click.argument("amount", type=AMOUNT),
    "job": click.argument("job", type=int, metavar="JOB_ID"),
    "op": click.argument("op", metavar="OPERATOR_ADDRESS"),
}
TX_HELP = {
    "stake": "Add AMOUNT to the operator's self-stake. Example: dtrain operator stake 1ether",
    "unstake": "Queue AMOUNT of self-stake for unbonding. "
    "Example: dtrain operator unstake 0.5ether",
    "deregister": "Deregister (no active jobs) and queue all self-stake for unbonding.",
    "join": "Join JOB_ID at the next epoch boundary. Example: dtrain operator join 1",
    "leave": "Leave JOB_ID at the next epoch boundary. Example: dtrain operator leave 1",
    "delegate": "Delegate AMOUNT to OPERATOR. Example: dtrain stake delegate 0xabc... 5ether",
    "undelegate": "Queue AMOUNT of a delegation for unbonding.\n\n"
    "Example: dtrain stake undelegate 0xabc... 1ether",
    "withdraw": "Credit unbonded stake with OPERATOR once unlocked (then `dtrain rewards "
    "withdraw`). Example: dtrain stake withdraw 0xabc...",
}
