// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";
import {Handler} from "./Handler.sol";

contract InvariantsTest is BaseTest {
    Handler internal handler;

    function setUp() public override {
        super.setUp();
        bsm = deployBSM(campaignParams());
        handler = new Handler(bsm, core, treasury, developer);
        targetContract(address(handler));
    }

    /// Every property below, after every call of one campaign. The nine properties once had a
    /// campaign each, but from the fixed seed each made the same 12,800 calls of the same
    /// handler: one campaign checks each property on the same call sequences, in 77 s of CPU
    /// instead of 190 s.
    function invariant_accounting() public view {
        _balanceEqualsAccounting();
        _etherInMinusOut();
        _creditsLedgerComplete();
        _settlementExact();
        _perAccountSettlement();
        _tokenBalanceEqualsAccounting();
        _tokenInMinusOut();
        _tokenCreditsLedgerComplete();
        _rewardsCovered();
    }

    /// contract balance == stakes + unbonding + escrow + unclaimed credits (+ pool rewards)
    function _balanceEqualsAccounting() internal view {
        assertConserved();
    }

    /// Every wei that came in is either still held or was withdrawn.
    function _etherInMinusOut() internal view {
        vm.assertEq(address(bsm).balance, handler.ghostIn() - handler.ghostOut(), "in - out");
    }

    /// The credits ledger is the sum of every actor's credit.
    function _creditsLedgerComplete() internal view {
        (,,, uint256 credits,) = bsm.accounting();
        uint256 sum;
        for (uint256 i; i < handler.actorCount(); ++i) {
            sum += bsm.creditOf(handler.actors(i));
        }
        vm.assertEq(sum, credits, "credits ledger");
    }

    /// Each paid operator-epoch splits exactly its price; no slashed wei is lost.
    function _settlementExact() internal view {
        vm.assertEq(handler.ghostSplitViolations(), 0, "fee split");
        vm.assertEq(handler.ghostSettlementViolations(), 0, "settlement");
    }

    /// Who, not only totals: every settlement paid, slashed, refunded and rewarded exactly the
    /// accounts it should (see Handler._checkWho), across jobs sharing operators and votes.
    /// Nor did anybody take a seat in a job that requires a TEE without a valid attestation.
    function _perAccountSettlement() internal view {
        vm.assertEq(handler.ghostWhoViolations(), 0, "per-account settlement");
        vm.assertEq(handler.ghostChallengeViolations(), 0, "challenge bonds and referee slashes");
        vm.assertEq(handler.ghostTeeJoinViolations(), 0, "TEE seat without attestation");
        vm.assertEq(handler.ghostSeatViolations(), 0, "seat draw: count or released bonds");
    }

    /// Per token: the BSM's balance == escrow + credits + unclaimed staker rewards in it.
    function _tokenBalanceEqualsAccounting() internal view {
        for (uint256 t; t < handler.tokenCount(); ++t) {
            IERC20 token = IERC20(handler.tokens(t));
            (uint256 e, uint256 c, uint256 r) = bsm.tokenAccounting(address(token));
            vm.assertEq(token.balanceOf(address(bsm)), e + c + r, "token balance != accounted");
        }
    }

    /// Every token unit that came in is either still held or was withdrawn, per token.
    function _tokenInMinusOut() internal view {
        for (uint256 t; t < handler.tokenCount(); ++t) {
            address token = handler.tokens(t);
            vm.assertEq(
                IERC20(token).balanceOf(address(bsm)),
                handler.ghostTokenIn(token) - handler.ghostTokenOut(token),
                "token in - out"
            );
        }
    }

    /// Each token's credits ledger is the sum of every actor's credit in it.
    function _tokenCreditsLedgerComplete() internal view {
        for (uint256 t; t < handler.tokenCount(); ++t) {
            address token = handler.tokens(t);
            (, uint256 credits,) = bsm.tokenAccounting(token);
            uint256 sum;
            for (uint256 i; i < handler.actorCount(); ++i) {
                sum += bsm.tokenCreditOf(token, handler.actors(i));
            }
            vm.assertEq(sum, credits, "token credits ledger");
        }
    }

    /// Pending staker rewards never exceed what the pool holds for them.
    function _rewardsCovered() internal view {
        for (uint256 o; o < 4; ++o) {
            address op_ = handler.operators(o);
            uint256 owed;
            for (uint256 i; i < handler.actorCount(); ++i) {
                owed += bsm.pendingRewards(op_, handler.actors(i));
            }
            vm.assertLe(owed, bsm.getPool(op_).rewardReserve, "rewards exceed reserve");
        }
    }
}

/// How much of the protocol the handler reaches: its own campaign (one invariant, so its runs
/// are sequential) adds each run's counts to totals kept in environment variables, which
/// survive between runs. `forge test --mc ReachTest -vv` prints the totals after the last run.
contract ReachTest is BaseTest {
    Handler internal handler;

    function setUp() public override {
        super.setUp();
        bsm = deployBSM(campaignParams());
        handler = new Handler(bsm, core, treasury, developer);
        targetContract(address(handler));
    }

    function invariant_reach() public view {
        vm.assertEq(handler.ghostWhoViolations(), 0, "per-account settlement");
        vm.assertEq(handler.ghostChallengeViolations(), 0, "challenge bonds and referee slashes");
        vm.assertEq(handler.ghostSeatViolations(), 0, "seat draw: count or released bonds");
    }

    function afterInvariant() public {
        _add("runs", 1);
        _add("completed jobs", handler.ghostCompletedJobs());
        _add("failed-job refunds", handler.ghostFailedRefunds());
        _add("short-epoch jobs", handler.ghostShortEpochJobs());
        _add("cross-job shared votes", handler.ghostCrossJobVotes());
        _add("paid operator-epochs", handler.ghostPaidEpochs());
        _add("unworkable aborts", handler.ghostAbortedJobs());
        _add("open-timeout failures", handler.ghostExpiredJobs());
        _add("withheld reveals", handler.ghostWithheldReveals());
        _add("token jobs", handler.ghostTokenJobs());
        _add("jobs in a 6-decimal token", handler.ghostJobsIn(address(handler.usd())));
        _add("jobs in a 2-decimal token", handler.ghostJobsIn(address(handler.dec2())));
        _add("token paid operator-epochs", handler.ghostTokenPaidEpochs());
        _add("hook settlements in pieces", handler.ghostHookSettlements());
        _add("queued joins", handler.ghostQueuedJoins());
        _add("TEE jobs", handler.ghostTeeJobs());
        _add("TEE seats taken", handler.ghostTeeJoins());
        _add("challenges", handler.ghostChallenges());
        _add("verdicts", handler.ghostVerdicts());
        _add("certified votes overturned", handler.ghostOverturned());
        _add("challenges with a referee slashed", handler.ghostRefereesSlashed());
        _add("verdicts with consistent voters", handler.ghostConsistentVerdicts());
        _add("verdicts that caught a member by replay", handler.ghostCaughtVerdicts());
        _add("attempts without a quorum taken to the referees", handler.ghostUncertifiedChallenges());
        _add("verdicts whose referees were paid", handler.ghostPaidVerdicts());
        _add("seat draws", handler.ghostSeatDraws());
        _add("applicants not drawn", handler.ghostSeatsNotDrawn());
        _add("vacancies drawn among a queue", handler.ghostVacancyDraws());
        _add("vacancy draws deferred (seed not mined)", handler.ghostVacancyDeferrals());
        _add("running-job cancel requests", handler.ghostCancelRequests());
        _add("running jobs cancelled at a boundary", handler.ghostCancelledRunning());
        // After the campaign's last run every path must have been reached at least once.
        if (_total("runs") == vm.envOr("FOUNDRY_INVARIANT_RUNS", uint256(256))) {
            for (uint256 i; i < _keys.length; ++i) {
                vm.assertGe(_total(_keys[i]), 1, string.concat("never reached: ", _keys[i]));
            }
        }
    }

    string[] internal _keys;

    function _env(string memory key) internal pure returns (string memory) {
        return string.concat("DTRAIN_REACH_", vm_toString(uint256(keccak256(bytes(key)))));
    }

    function _total(string memory key) internal view returns (uint256) {
        return vm.envOr(_env(key), uint256(0));
    }

    function _add(string memory key, uint256 n) internal {
        uint256 total = _total(key) + n;
        vm.setEnv(_env(key), vm.toString(total));
        _keys.push(key);
        emit log_named_uint(string.concat("reach: ", key), total);
    }

    event log_named_uint(string key, uint256 val);
}

/// The handler's settlement path really settles: a fixed sequence pays and slashes.
contract HandlerSmokeTest is BaseTest {
    function test_handlerSettles() public {
        Handler h = new Handler(bsm, core, treasury, developer);
        for (uint256 i; i < 4; ++i) {
            h.register(i, 2 ether);
        }
        h.createJob(3, 4, 3, 0.01 ether); // min 3, max 4, 3 epochs
        for (uint256 i; i < 4; ++i) {
            h.join(i, 0); // the 4th joins at the first boundary
        }
        h.submit(0, 0); // everyone agrees, full participation
        h.finalize(0, 0);
        vm.assertEq(h.ghostPaidEpochs(), 3);
        // Member 2 forges its checkpoint: 3 of 4 agree, member 2 is slashed.
        h.submit(0, uint256(1) << 18);
        h.finalize(0, 0);
        vm.assertEq(h.ghostPaidEpochs(), 6);
        uint256 slashed = h.ghostSlashed();
        vm.assertTrue(slashed > 0);
        // Member 1 commits and never reveals: a dropout; 2 of 3 still agree.
        h.submit(0, uint256(1) << 21);
        h.finalize(0, 0);
        vm.assertEq(h.ghostWithheldReveals(), 1);
        vm.assertEq(h.ghostPaidEpochs(), 8);
        vm.assertTrue(h.ghostSlashed() > slashed);
        vm.assertEq(h.ghostCompletedJobs(), 1);
        vm.assertEq(h.ghostSplitViolations(), 0);
        vm.assertEq(h.ghostSettlementViolations(), 0);
        vm.assertEq(h.ghostWhoViolations(), 0);
        assertConserved();
    }

    /// A running job its caller cancels: the epoch in progress is paid, then the job closes
    /// Cancelled with the unearned escrow refunded (the handler's checks count no violation).
    function test_handlerCancelsRunning() public {
        Handler h = new Handler(bsm, core, treasury, developer);
        for (uint256 i; i < 3; ++i) {
            h.register(i, 2 ether);
        }
        h.createJob(3, 3, 3, 0.01 ether);
        for (uint256 i; i < 3; ++i) {
            h.join(i, 0);
        }
        h.cancelRunning(0);
        h.cancelRunning(0); // once only: the handler skips a job already asked
        vm.assertEq(h.ghostCancelRequests(), 1);
        h.submit(0, 0);
        h.finalize(0, 0);
        vm.assertEq(h.ghostPaidEpochs(), 3);
        vm.assertEq(h.ghostCancelledRunning(), 1);
        vm.assertEq(h.ghostSettlementViolations(), 0);
        vm.assertEq(h.ghostWhoViolations(), 0);
        assertConserved();
    }

    function test_wholeJobCancelled() public {
        bsm = deployBSM(campaignParams());
        Handler h = new Handler(bsm, core, treasury, developer);
        h.wholeJob(2, 3, false, uint256(3) << 38);
        vm.assertEq(h.ghostCancelRequests(), 1);
        vm.assertEq(h.ghostCancelledRunning(), 1);
    }

    /// The handler's challenge game runs to its end: upheld (the honest certified vote, one
    /// referee forging) and overturned (every member voted one forged checkpoint, one referee
    /// silent).
    function test_handlerChallenges() public {
        bsm = deployBSM(challengeParams());
        Handler h = new Handler(bsm, core, treasury, developer);
        for (uint256 i; i < 3; ++i) {
            h.register(i, 2 ether);
        }
        h.createJob(3, 3, 2, 0.01 ether);
        for (uint256 i; i < 3; ++i) {
            h.join(i, 0);
        }
        h.submit(0, 0); // everyone honest
        h.challenge(0, (1 << 4) | 1); // by the caller; referee 1 reveals a forged verdict
        vm.assertEq(h.ghostChallenges(), 1);
        vm.assertEq(h.ghostVerdicts(), 1);
        vm.assertEq(h.ghostOverturned(), 0);
        vm.assertEq(h.ghostRefereesSlashed(), 1);
        h.finalize(0, 0);
        vm.assertEq(h.ghostPaidEpochs(), 3);
        h.submit(0, uint256(1) << 24); // every member votes one made-up checkpoint
        h.challenge(0, (1 << 5) | 4); // by member 2; referee 2 silent
        vm.assertEq(h.ghostChallenges(), 2);
        vm.assertEq(h.ghostVerdicts(), 2);
        vm.assertEq(h.ghostOverturned(), 1);
        vm.assertEq(h.ghostRefereesSlashed(), 2);
        uint256 slashed = h.ghostSlashed();
        h.finalize(0, 0);
        vm.assertEq(h.ghostPaidEpochs(), 3, "nobody voted the verdict");
        vm.assertTrue(h.ghostSlashed() > slashed);
        vm.assertEq(h.ghostChallengeViolations(), 0);
        vm.assertEq(h.ghostWhoViolations(), 0);
        vm.assertEq(h.ghostSettlementViolations(), 0);
        assertConserved();
    }

    /// A job paid in the token settles in the token: the split, the refund and the books.
    function test_handlerSettlesTokenJob() public {
        Handler h = new Handler(bsm, core, treasury, developer);
        for (uint256 i; i < 3; ++i) {
            h.register(i, 2 ether);
        }
        h.createJob(3, 4, 2, 0.01 ether | (uint256(1) << 132)); // min 3, max 4: one seat refunded
        vm.assertEq(bsm.jobToken(1), address(h.usd()));
        for (uint256 i; i < 3; ++i) {
            h.join(i, 0);
        }
        h.submit(0, 0);
        h.finalize(0, 0);
        h.submit(0, uint256(1) << 18); // member 2 forges: slashed in ether
        h.finalize(0, 0);
        vm.assertEq(h.ghostTokenPaidEpochs(), 5);
        vm.assertTrue(h.ghostSlashed() > 0);
        vm.assertEq(h.ghostCompletedJobs(), 1);
        vm.assertEq(h.ghostSplitViolations(), 0);
        vm.assertEq(h.ghostSettlementViolations(), 0);
        vm.assertEq(h.ghostWhoViolations(), 0);
        for (uint256 i; i < h.actorCount(); ++i) {
            h.withdrawToken(i);
        }
        (uint256 e, uint256 c, uint256 r) = bsm.tokenAccounting(address(h.usd()));
        vm.assertEq(e + c, 0);
        vm.assertEq(h.usd().balanceOf(address(bsm)), r);
        vm.assertEq(h.ghostTokenIn(address(h.usd())) - h.ghostTokenOut(address(h.usd())), r);
        assertConserved();
        // A whole token job in one step pays in the token too.
        h.wholeJob(2, 2, false, uint256(1) << 132);
        vm.assertEq(h.ghostTokenJobs(), 2);
        vm.assertEq(h.ghostTokenPaidEpochs(), 9);
        vm.assertEq(h.ghostSettlementViolations() + h.ghostWhoViolations() + h.ghostSplitViolations(), 0);
    }

    /// A job priced at 7 units of a 2-decimal token: the split's remainders, the staker
    /// rewards and the refund keep every unit; once everyone withdrew, the BSM holds exactly
    /// the stakers' unclaimed rewards in it.
    function test_handlerSettlesTwoDecimalTokenJob() public {
        Handler h = new Handler(bsm, core, treasury, developer);
        for (uint256 i; i < 3; ++i) {
            h.register(i, 2 ether);
            h.delegate(3 + i, i, 1 ether);
        }
        // priced in the 2-decimal token (bits 132, 133) at bound(x, 1, 1 ether) == 7 units
        uint256 hi = (uint256(1) << 132) | (uint256(1) << 133);
        h.createJob(2, 3, 2, hi + (1 ether + 6 - hi % 1 ether) % 1 ether); // min 2, max 3
        address dec2 = address(h.dec2());
        vm.assertEq(bsm.jobToken(1), dec2);
        (I.JobSpec memory spec,) = bsm.getJob(1);
        vm.assertEq(spec.pricePerOperatorEpoch, 7);
        for (uint256 i; i < 2; ++i) {
            h.join(i, 0);
        }
        for (uint256 k; k < 2; ++k) {
            h.submit(0, 0);
            h.finalize(0, 0);
        }
        vm.assertEq(h.ghostJobsIn(dec2), 1);
        vm.assertEq(h.ghostCompletedJobs(), 1);
        vm.assertEq(h.ghostSplitViolations() + h.ghostSettlementViolations() + h.ghostWhoViolations(), 0);
        for (uint256 i; i < h.actorCount(); ++i) {
            h.withdrawToken(i | (uint256(1) << 128));
        }
        (uint256 e, uint256 c, uint256 r) = bsm.tokenAccounting(dec2);
        vm.assertEq(e + c, 0);
        vm.assertEq(h.dec2().balanceOf(address(bsm)), r);
        vm.assertEq(h.ghostTokenIn(dec2) - h.ghostTokenOut(dec2), r);
        vm.assertEq(h.ghostTokenIn(dec2), 7 * 3 * 2); // escrow of 3 seats for 2 epochs
        assertConserved();
    }

    /// Everyone votes UNWORKABLE: the job aborts, nobody is slashed, voters are compensated.
    function test_handlerAborts() public {
        Handler h = new Handler(bsm, core, treasury, developer);
        for (uint256 i; i < 3; ++i) {
            h.register(i, 2 ether);
        }
        h.createJob(3, 3, 2, 0.01 ether);
        for (uint256 i; i < 3; ++i) {
            h.join(i, 0);
        }
        h.submit(0, uint256(1) << 25);
        h.finalize(0, 0);
        vm.assertEq(h.ghostAbortedJobs(), 1);
        vm.assertEq(h.ghostSlashed(), 0);
        vm.assertEq(h.ghostWhoViolations(), 0);
        vm.assertEq(h.ghostSettlementViolations(), 0);
        assertConserved();
    }
}
