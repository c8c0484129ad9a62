"""Writes the gas table of every BSM function, measured with a job at the 32-member cap.

Runs `forge test --match-contract GasAtCapTest --gas-report --json` (the native forge binary)
and renders docs/gas.md and docs/gas.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORGE = ROOT / "scripts/toolchain/node_modules/@foundry-rs/forge-linux-amd64/bin/forge"
LIMITS = {
    # a join into a full list of 32 seat applicants reads each one's stake (~351k cold)
    "joinJob": 450_000,
    "commitCheckpoint": 200_000,
    "revealCheckpoint": 200_000,
    "withdraw": 200_000,
    "finalizeEpoch": 5_000_000,
}


def measure() -> dict[str, dict[str, int]]:
    out = subprocess.run(
        [str(FORGE), "test", "--match-contract", "GasAtCapTest", "--gas-report", "--json"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    start = out.index("[")
    report = json.loads(out[start:])
    for contract in report:
        if contract["contract"].endswith(":DistributedTrainingBSM"):
            return {name.split("(")[0]: stats for name, stats in contract["functions"].items()}
    raise SystemExit("gas report: DistributedTrainingBSM not found in forge output")


HOOK_CAP = 500_000


def measure_hooks() -> dict[str, int]:
    """The heaviest hook call of `HookGasCapTest` (a 32-member job finalized through the hooks
    as tnt-core calls them, 500k gas per call) and how many finalize calls two epochs took."""
    out = subprocess.run(
        [str(FORGE), "test", "--match-contract", "HookGasCapTest", "-vv"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: dict[str, int] = {}
    for line in out.splitlines():
        key, _, value = line.strip().rpartition(": ")
        if key in ("max gas of one hook call", "finalize hook calls for 2 epochs"):
            found[key] = int(value)
    if len(found) != 2:
        raise SystemExit("gas report: HookGasCapTest did not print its measurements")
    return found


COLD_TESTS = {  # test: what it finalizes through the hooks
    "test_wholeJobThroughHooks": "3 members, 2 epochs",
    "test_hookGasCap_finalizeAtCapInPieces": "32 members, 2 epochs (a third slashed in the 2nd)",
    "test_hookGasCap_tokenJobFourTokensRolling": "32 members, token job, pools in 4 tokens",
}


def measure_cold() -> dict[str, list[int]]:
    """Every finalize hook call's gas with cold storage, as in real transactions: the hook
    tests under `forge test --isolate` (each call its own transaction), the harness's cap
    raised so that calls over 500k are measured instead of failing."""
    out = subprocess.run(
        [str(FORGE), "test", "--isolate", "--match-test", "|".join(COLD_TESTS), "-vv"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "HOOK_GAS_CAP": "10000000"},
    ).stdout
    found: dict[str, list[int]] = {}
    test = None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("[PASS] "):
            test = line.split()[1].split("(")[0]
            found[test] = []
        elif test and line.startswith("finalize hook gas: "):
            found[test].append(int(line.rpartition(": ")[2]))
    if set(found) != set(COLD_TESTS):
        raise SystemExit(f"gas report: cold hook tests measured {sorted(found)}")
    return found


def render_cold(cold: dict[str, list[int]]) -> list[str]:
    lines = [
        "",
        "With cold storage (`forge test --isolate`: each hook call its own transaction, as on a",
        "real chain), every finalize hook call:",
        "",
        "| job | finalize calls | max | calls over 500k |",
        "|---|---:|---:|---:|",
    ]
    for test, what in COLD_TESTS.items():
        gas = cold[test]
        over = sum(g > HOOK_CAP for g in gas)
        lines.append(f"| {what} | {len(gas)} | {max(gas):,} | {over} |")
    worst = max(max(g) for g in cold.values())
    verdict = "fits" if worst <= HOOK_CAP else "does NOT fit"
    lines += [
        "",
        f"The heaviest call ({worst:,}) {verdict} the core's {HOOK_CAP:,}: each call settles",
        "`HOOK_SETTLE_BATCH` members and releases those leaving at the boundary as it settles",
        "them, and one more call ends the epoch (it reads no member's stake).",
    ]
    return lines


def render(
    functions: dict[str, dict[str, int]], hooks: dict[str, int], cold: dict[str, list[int]]
) -> str:
    lines = [
        "# Gas at the cap",
        "",
        "Measured by `make gas` (`scripts/gas_report.py`): forge's gas report of",
        "`contracts/test/GasAtCap.t.sol`, where a job has 32 members (the hard cap",
        "`MAX_OPERATORS_CAP`), each operator has a delegator, and epochs are settled with all",
        "members paid, all members slashed, and the last epoch closing the job. Gas includes the",
        "21,000 intrinsic cost. `GasAtCapTest` also asserts the limits below, so `make test` fails",
        "when a change breaks them. Registration, stake, delegation, unbonding and claims (the",
        "hooks extension) and every view, token entry point and the challenge game (the views",
        "extension) run behind the BSM's `fallback` and show as `fallback` here;",
        "`GasAtCapTest` asserts registration under 225,000.",
        "",
        "| function | calls | min | median | max | limit |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in sorted(functions):
        s = functions[name]
        limit = LIMITS.get(name)
        lines.append(
            f"| `{name}` | {s['calls']} | {s['min']:,} | {s['median']:,} | {s['max']:,} | "
            f"{f'{limit:,}' if limit else ''} |"
        )
    lines += [
        "",
        "Through the Tangle hooks (`HookGasCapTest`, tnt-core's 500,000 gas per hook call): the",
        f"heaviest hook call of a 32-member job took {hooks['max gas of one hook call']:,} gas;",
        "finalizing settles `HOOK_SETTLE_BATCH` = 2 members per call, "
        f"{hooks['finalize hook calls for 2 epochs']} calls for 2 epochs (storage warm",
        "between calls).",
        *render_cold(cold),
        "",
        "Notes:",
        "- The first registration on a fresh contract turns the `staked` total from zero to",
        "  non-zero (+17k once); `GasAtCapTest` measures a later one.",
        "- `joinJob` max is the join that reaches `minOperators` and starts the epoch: O(1), the",
        "  member list is not copied.",
        "- `finalizeEpoch` is O(members): it pays or slashes each member of the epoch and applies",
        "  joins and leaves at the boundary. Its max is a 32-member job paid in a token whose",
        "  members' pools earned in all four payment tokens and each roll both fresh slots at",
        "  this finalize (recording the pool's rates in ether and four tokens twice, over",
        "  placeholders the deposits stored); without rolling slots that job's finalize costs",
        "  ~1.6M, and an ether job's with 32 members paid ~3.2M.",
        "- `delegate` max is a delegation to an operator that is in a job whose pool earned in",
        "  four payment tokens: it settles the account's rewards in each (one credit per token)",
        "  and writes the pool's fresh slot. `claimRewards` max is the same settle (four tokens).",
        "- `commitCheckpoint` stores one hash. `revealCheckpoint` is O(members): it rehashes the",
        "  commitment and checks every participation entry (32 at the cap); its max is the first",
        "  reveal of a vote, which stores the vote's checkpoint and sync-failure bitmap.",
        "- Views run in the extension `DistributedTrainingBSMViews` through the BSM's `fallback`",
        "  (a delegatecall, ~3k gas more than a direct view), and the Tangle hooks in",
        "  `DistributedTrainingBSMHooks` through the views' `fallback` (a second delegatecall);",
        "  both appear as `fallback` here because the tests call them through the BSM.",
        "  So do the token entry points (`createJobWithToken` ~330k, `withdrawToken`,",
        "  `setPaymentToken`), which live in the views extension.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    functions = measure()
    hooks = measure_hooks()
    cold = measure_cold()
    docs = ROOT / "docs"
    out = {**functions, "hooks": hooks, "hooks_cold": cold}
    (docs / "gas.json").write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    (docs / "gas.md").write_text(render(functions, hooks, cold))
    if hooks["max gas of one hook call"] > HOOK_CAP:
        print(
            f"gas: a hook call took {hooks['max gas of one hook call']:,} > {HOOK_CAP:,}",
            file=sys.stderr,
        )
        return 1
    missing = sorted(set(LIMITS) - set(functions))
    if missing:
        print(f"gas: GasAtCapTest measured no call of {', '.join(missing)}", file=sys.stderr)
        return 1
    for name, limit in LIMITS.items():
        if functions[name]["max"] > limit:
            print(f"gas: {name} max {functions[name]['max']:,} > {limit:,}", file=sys.stderr)
            return 1
    print(render(functions, hooks, cold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
