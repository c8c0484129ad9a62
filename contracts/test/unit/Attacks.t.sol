// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

/// Attack 1: a member of another job submits the victim job's expected vote first, with a
/// spec whose sync threshold makes every member look unsynced. Votes, thresholds and tallies
/// are keyed per job and attempt, so the victim job settles as if the attacker did not exist.
contract CrossJobVotePoisoningTest is BaseTest {
    function test_crossJobVotePoisoning_cannotSlashVictims() public {
        address[] memory ops = registerN(6);
        address[] memory victims = new address[](3);
        address[] memory attackers = new address[](3);
        for (uint256 i; i < 3; ++i) {
            (victims[i], attackers[i]) = (ops[i], ops[i + 3]);
        }
        uint256 victimJob = createJob(spec(3, 3, 2)); // 40 steps / K=4: 10 rounds, threshold 5
        I.JobSpec memory s = spec(3, 3, 2);
        s.stepsPerEpoch = 400; // 100 rounds, threshold 50: 10 rounds look like a sync failure
        uint256 attackJob = createJob(s);
        joinAll(victimJob, victims);
        joinAll(attackJob, attackers);

        // The attackers vote the victims' expected (checkpoint, participation) in their own
        // job, and reveal it before the victims do.
        uint32[] memory expected = fullParticipation(victimJob); // [10, 10, 10]
        for (uint256 i; i < 3; ++i) {
            submit(attackJob, attackers[i], keccak256("victim-ckpt"), expected);
        }
        reveal(attackJob);

        submitAll(victimJob, keccak256("victim-ckpt"));
        finalize(victimJob);
        for (uint256 i; i < 3; ++i) {
            vm.assertEq(bsm.creditOf(victims[i]), PRICE * 40 / 100, "honest victim unpaid");
            vm.assertEq(bsm.stakeOf(victims[i], victims[i]), MIN_STAKE, "honest victim slashed");
        }
        vm.assertEq(state(victimJob).epoch, 1);
        assertConserved();
    }

    /// The same vote in two jobs settles by each job's own spec.
    function testFuzz_isolation_sameVoteTwoSpecs(uint32 stepsB) public {
        stepsB = uint32(bound(stepsB, 40, 4000));
        address[] memory ops = registerN(4);
        address[] memory a = new address[](2);
        address[] memory b = new address[](2);
        (a[0], a[1], b[0], b[1]) = (ops[0], ops[1], ops[2], ops[3]);
        uint256 jobA = createJob(spec(2, 2, 1));
        I.JobSpec memory s = spec(2, 2, 1);
        s.stepsPerEpoch = stepsB;
        uint256 jobB = createJob(s);
        joinAll(jobA, a);
        joinAll(jobB, b);
        uint32[] memory p = fullParticipation(jobA);
        submit(jobB, b[0], keccak256("x"), p);
        submit(jobB, b[1], keccak256("x"), p);
        reveal(jobB);
        submitAll(jobA, keccak256("x"));
        finalize(jobA);
        vm.assertEq(bsm.creditOf(a[0]), PRICE * 40 / 100);
        vm.assertEq(bsm.creditOf(a[1]), PRICE * 40 / 100);
        assertConserved();
    }
}

/// Attack 3 (rounding): `unstake` checked the remaining stake before the share rounding, so
/// asking for exactly `stake - minStake` could leave `minStake - 1` and evict the operator at
/// the next boundary. The check now runs on what really remains.
contract UnstakeRoundingCannotEvictTest is BaseTest {
    function testFuzz_unstakeRoundingCannotEvict(uint256 extra, uint256 delegated, uint8 pct) public {
        extra = bound(extra, 1, 10 ether);
        delegated = bound(delegated, 1, 10 ether);
        pct = uint8(bound(pct, 1, 50));
        address a = op(1);
        register(a, MIN_STAKE + extra);
        vm.prank(staker);
        bsm.delegate{value: delegated}(a);
        vm.prank(core);
        bsm.onSlash(0, abi.encodePacked(a), pct); // share price below 1
        uint256 have = bsm.stakeOf(a, a);
        if (have <= MIN_STAKE) return;
        vm.prank(a);
        try bsm.unstake(have - MIN_STAKE) {
            vm.assertGe(bsm.stakeOf(a, a), MIN_STAKE, "rounding left the operator below minStake");
        } catch {}
        vm.assertGe(bsm.stakeOf(a, a), MIN_STAKE);
    }
}

/// Attack 3 (rewards): a delegation made just before `finalizeEpoch` earned a whole epoch's
/// staker reward. Staker rewards now go to stake present for the whole epoch.
contract LastMinuteDelegationTest is BaseTest {
    function test_lastMinuteDelegation_earnsNothing() public {
        (uint256 jobId, address[] memory ops) = runningJob(2, 2);
        submitAll(jobId, keccak256("c0"));
        vm.prank(staker);
        bsm.delegate{value: 100 ether}(ops[0]);
        finalize(jobId);
        vm.assertEq(bsm.pendingRewards(ops[0], staker), 0, "late delegation was paid");
        // The operator's own stake, present for the whole epoch, gets the whole pool cut.
        vm.assertEq(bsm.pendingRewards(ops[0], ops[0]), PRICE * 20 / 100);
        assertConserved();
    }

    /// Whenever in an epoch a delegation lands, that epoch pays it nothing; once it has been
    /// present for whole epochs (from the second reward period after it) it earns its share.
    function testFuzz_lastMinuteDelegation_onlyWholeEpochs(uint256 dt, uint256 amount) public {
        amount = bound(amount, 1, 1000 ether);
        (uint256 jobId, address[] memory ops) = runningJob(2, 3);
        dt = bound(dt, 0, GRACE + EPOCH);
        vm.warp(block.timestamp + dt);
        vm.prank(staker);
        bsm.delegate{value: amount}(ops[0]);
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        vm.assertEq(bsm.pendingRewards(ops[0], staker), 0, "paid for an epoch it missed");
        // Two reward periods later the stake has matured; an epoch that starts then pays it
        // pro rata.
        vm.warp(block.timestamp + 2 * bsm.rewardPeriod());
        uint256 job2 = createJob(spec(2, 2, 1));
        joinAll(job2, ops);
        submitAll(job2, keccak256("c1"));
        finalize(job2);
        uint256 pool = PRICE * 20 / 100;
        vm.assertApproxEqAbs(
            bsm.pendingRewards(ops[0], staker),
            pool * amount / (amount + MIN_STAKE),
            amount / 1e18 + 2, // reward-per-share rounding
            "matured stake unpaid"
        );
        assertConserved();
    }
}

/// Attack 2: a caller creates a job whose epoch nobody can finish, lets the operator's own
/// join start it, finalizes and pockets the dropout slash of the operator's whole pool. Now
/// an epoch lasts at least `minEpochDuration` after a `startGrace`, and slashed stake goes to
/// the treasury, whole: the caller, every member and the finalizer get nothing from a slash
/// (an outside finalizer earns a share of the protocol's fee, at most `maxReporterBounty`).
contract HoneypotJobTest is BaseTest {
    function test_honeypotJob_tooShortEpochRejected() public {
        I.JobSpec memory s = spec(2, 2, 1);
        s.epochDuration = 1;
        vm.prank(caller);
        vm.expectRevert(
            abi.encodeWithSelector(I.InvalidEpochDuration.selector, 1, MIN_EPOCH, UNBONDING / 4 - GRACE - REVEAL_WINDOW)
        );
        bsm.createJob{value: escrowOf(s)}(s);
    }

    function test_honeypotJob_callerCannotProfit() public {
        address victim = op(1);
        register(victim, MIN_STAKE);
        address other = op(2);
        register(other, MIN_STAKE);
        vm.prank(staker);
        bsm.delegate{value: 50 ether}(victim); // the pool a honeypot would target
        I.JobSpec memory s = spec(2, 2, 1);
        s.epochDuration = MIN_EPOCH; // the shortest allowed
        uint256 callerFunds = caller.balance;
        uint256 jobId = createJob(s);
        vm.prank(other);
        bsm.joinJob(jobId);
        uint256 joinedAt = block.timestamp;
        vm.prank(victim);
        bsm.joinJob(jobId);
        // The operators have the grace, the whole epoch and the reveal window: nothing is
        // finalizable before.
        vm.assertEq(bsm.epochDeadline(jobId), joinedAt + GRACE + MIN_EPOCH);
        vm.warp(joinedAt + GRACE + MIN_EPOCH + REVEAL_WINDOW);
        vm.prank(caller);
        vm.expectRevert();
        bsm.finalizeEpoch(jobId, 0);
        // They stay offline; the caller finalizes after the reveal deadline.
        vm.warp(joinedAt + GRACE + MIN_EPOCH + REVEAL_WINDOW + 1);
        uint256 pools = bsm.getPool(victim).totalAssets + bsm.getPool(other).totalAssets;
        uint256 treasuryBefore = bsm.creditOf(treasury);
        vm.prank(caller);
        bsm.finalizeEpoch(jobId, 0);
        uint256 slashed = pools - bsm.getPool(victim).totalAssets - bsm.getPool(other).totalAssets;
        vm.assertTrue(slashed > 0);
        vm.assertEq(bsm.creditOf(treasury) - treasuryBefore, slashed, "slash to the treasury");
        // The slashed members left: the job waits Open; the caller cancels for its escrow back
        // and ends with no more than it started with.
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Open));
        vm.prank(caller);
        bsm.cancelJob(jobId);
        vm.prank(caller);
        bsm.withdraw();
        vm.assertLe(caller.balance, callerFunds, "the caller profited from the slash");
        assertConserved();
    }

    /// An outside finalizer earns the same whoever is slashed and however large the slash: a
    /// share of the protocol's fee for the epoch's paid work, at most `maxReporterBounty`.
    function testFuzz_finalizerRewardBounded(uint256 delegated) public {
        delegated = bound(delegated, 0, 10_000 ether);
        address[] memory ops = registerN(3);
        if (delegated > 0) {
            vm.prank(staker);
            bsm.delegate{value: delegated}(ops[2]);
        }
        uint256 jobId = createJob(spec(3, 3, 1));
        joinAll(jobId, ops);
        uint32[] memory p = fullParticipation(jobId);
        submit(jobId, ops[0], keccak256("good"), p);
        submit(jobId, ops[1], keccak256("good"), p);
        vm.warp(bsm.epochDeadline(jobId) + 1);
        finalize(jobId);
        vm.assertEq(bsm.creditOf(reporter), 2 * PRICE * 20 / 100 / 10, "finalizer reward follows the slash");
        vm.assertEq(bsm.creditOf(caller), PRICE, "the caller gets only its unearned escrow");
        assertConserved();
    }
}

/// Attack 3 (unbonding): stake queued while it backs an epoch used to be withdrawable before
/// that epoch was settled (unbonding 7 days, epochs up to 30). An epoch now spans at most a
/// quarter of the unbonding period, so the stake is still there to slash at finalize.
contract StakeLeavesBeforeSlashTest is BaseTest {
    function test_stakeLeavesBeforeSlash_stillSlashed() public {
        address a = op(1);
        register(a, 2 * MIN_STAKE);
        vm.prank(staker);
        bsm.delegate{value: 10 ether}(a);
        address b = op(2);
        register(b, MIN_STAKE);
        I.JobSpec memory s = spec(2, 2, 1);
        s.epochDuration = uint64(UNBONDING / 4 - GRACE - REVEAL_WINDOW); // the longest allowed
        uint256 jobId = createJob(s);
        vm.prank(a);
        bsm.joinJob(jobId);
        vm.prank(b);
        bsm.joinJob(jobId);
        // Both queue everything they can right away and go offline.
        vm.prank(a);
        bsm.unstake(MIN_STAKE);
        vm.prank(staker);
        bsm.undelegate(a, 10 ether);
        uint256 deadline = bsm.revealDeadline(jobId);
        vm.warp(deadline + 1);
        vm.prank(staker);
        vm.expectRevert();
        bsm.withdrawUnbonded(a);
        uint256 before = bsm.getPool(a).unbondingAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(a).unbondingAssets, before - before * 500 / 10000, "unbonding stake slashed");
        assertConserved();
    }

    /// An epoch longer than unbondingPeriod / 4 - startGrace - revealWindow cannot be created.
    function testFuzz_epochFitsInUnbonding(uint64 duration) public {
        I.JobSpec memory s = spec(2, 2, 1);
        s.epochDuration = duration;
        vm.prank(caller);
        if (duration < MIN_EPOCH || duration > UNBONDING / 4 - GRACE - REVEAL_WINDOW) vm.expectRevert();
        bsm.createJob{value: escrowOf(s)}(s);
    }
}

/// Attack 3 (seats): a seat used to cost only `minStake`, reusable across any number of jobs,
/// so a sybil minority could block every job at once for free. Each seat now bonds the job's
/// `seatBond` of the member's own self-stake, which backs no other seat and cannot leave.
contract SybilSeatsTest is BaseTest {
    function test_sybilSeats_eachSeatBondsStake() public {
        address sybil = op(9);
        register(sybil, MIN_STAKE); // room for two 0.5 ETH seats
        uint256[] memory jobs = new uint256[](3);
        for (uint256 i; i < 3; ++i) {
            jobs[i] = createJob(spec(3, 3, 1));
        }
        vm.startPrank(sybil);
        bsm.joinJob(jobs[0]);
        bsm.joinJob(jobs[1]);
        vm.expectRevert(abi.encodeWithSelector(I.InsufficientFreeStake.selector, MIN_STAKE, 3 * SEAT_BOND));
        bsm.joinJob(jobs[2]);
        vm.stopPrank();
        vm.assertEq(bsm.bondedOf(sybil), 2 * SEAT_BOND);
    }

    function test_revert_StakeBonded() public {
        address a = op(9);
        register(a, 3 ether);
        I.JobSpec memory s = spec(2, 2, 1);
        s.seatBond = 2.5 ether;
        uint256 jobId = createJob(s);
        vm.prank(a);
        bsm.joinJob(jobId);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.StakeBonded.selector, 2 ether, 2.5 ether));
        bsm.unstake(1 ether);
        // Leaving releases the bond (the job is Open: at once).
        vm.prank(a);
        bsm.leaveJob(jobId);
        vm.assertEq(bsm.bondedOf(a), 0);
        vm.prank(a);
        bsm.unstake(1 ether);
    }

    function test_revert_SeatBondTooLow() public {
        I.JobSpec memory s = spec(2, 2, 1);
        s.seatBond = SEAT_BOND - 1;
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.SeatBondTooLow.selector, SEAT_BOND - 1, SEAT_BOND));
        bsm.createJob{value: escrowOf(s)}(s);
    }

    /// A caller whose sybils hold 2/3 of the seats outvotes the honest member and has it
    /// slashed for fabrication; the slash goes to the treasury, so the caller and its sybils
    /// end with less than they put in.
    function test_callerSybilQuorum_cannotProfit() public {
        address[] memory ops = registerN(3); // ops[0], ops[1]: the caller's sybils
        address honest = ops[2];
        uint256 jobId = createJob(spec(3, 3, 1));
        joinAll(jobId, ops);
        uint32[] memory p = fullParticipation(jobId);
        submit(jobId, ops[0], keccak256("whatever"), p);
        submit(jobId, ops[1], keccak256("whatever"), p);
        submit(jobId, honest, keccak256("trained"), p);
        uint256 honestPool = bsm.getPool(honest).totalAssets;
        finalize(jobId);
        vm.assertLt(bsm.getPool(honest).totalAssets, honestPool, "the honest member was slashed");
        // What the coalition got back: the caller's refund and its sybils' pay and rewards.
        uint256 back = bsm.creditOf(caller);
        for (uint256 i; i < 2; ++i) {
            back += bsm.creditOf(ops[i]) + bsm.pendingRewards(ops[i], ops[i]);
        }
        vm.assertLt(back, escrowOf(spec(3, 3, 1)), "the coalition profited from the slash");
        uint256 slash = honestPool * 1000 / 10000;
        uint256 bounty = 2 * PRICE * 20 / 100 / 10; // to the outside finalizer, from the fee
        vm.assertEq(bsm.creditOf(treasury), slash + 2 * PRICE * 20 / 100 - bounty);
        assertConserved();
    }
}

/// Attack: a coalition outvotes an honest member and finalizes from a fresh address of its own
/// to collect the finalizer's bounty out of the victim's slash. The bounty is now a share of
/// the protocol's fee for the epoch's paid work: slashing the honest member makes the
/// finalizer earn less (one fewer paid seat), not more, however large the victim's pool.
contract SlashBountyTest is BaseTest {
    function _epoch(uint256 victimDelegation, bool victimOutvoted) internal returns (uint256 earned) {
        address[] memory ops = registerN(3); // ops[0], ops[1]: the coalition
        if (victimDelegation > 0) {
            vm.prank(staker);
            bsm.delegate{value: victimDelegation}(ops[2]);
        }
        uint256 jobId = createJob(spec(3, 3, 1));
        joinAll(jobId, ops);
        uint32[] memory p = fullParticipation(jobId);
        submit(jobId, ops[0], keccak256("fabricated"), p);
        submit(jobId, ops[1], keccak256("fabricated"), p);
        submit(jobId, ops[2], victimOutvoted ? keccak256("trained") : keccak256("fabricated"), p);
        uint256 before = bsm.creditOf(reporter); // the coalition's fresh address
        finalize(jobId);
        earned = bsm.creditOf(reporter) - before;
    }

    function testFuzz_slashingAnHonestMemberPaysItsFinalizerNothing(uint256 victimDelegation) public {
        victimDelegation = bound(victimDelegation, 0, 1_000 ether);
        uint256 snap = vm.snapshotState();
        uint256 agreed = _epoch(victimDelegation, false);
        vm.revertToState(snap);
        uint256 withSlash = _epoch(victimDelegation, true);
        vm.assertEq(agreed, 3 * PRICE * 20 / 100 / 10, "3 paid seats");
        vm.assertEq(withSlash, 2 * PRICE * 20 / 100 / 10, "2 paid seats, nothing from the slash");
        assertConserved();
    }
}

/// Attack 3 (copying): votes were public before the deadline, so a member could copy the
/// majority's vote without training. Votes are now committed hidden (the commitment binds the
/// member's address) and revealed only when nobody can commit any more.
contract VoteCopyingTest is BaseTest {
    function test_voteCopying_commitmentCannotBeReused() public {
        (uint256 jobId, address[] memory ops) = runningJob(3, 1);
        uint32[] memory p = fullParticipation(jobId);
        submit(jobId, ops[0], keccak256("trained"), p);
        submit(jobId, ops[1], keccak256("trained"), p);
        // The copier re-sends ops[0]'s commitment as its own...
        (bytes32 seen,,) = bsm.submissionOf(jobId, ops[0]);
        vm.prank(ops[2]);
        bsm.commitCheckpoint(jobId, 0, seen);
        // ...and, once ops[0] reveals, replays its salt and vote: the commitment named ops[0].
        reveal(jobId);
        vm.prank(ops[2]);
        vm.expectRevert(abi.encodeWithSelector(I.CommitmentMismatch.selector, jobId, ops[2]));
        bsm.revealCheckpoint(
            jobId, 0, keccak256("trained"), p, transcriptOf(ops[0]), saltOf(ops[0], keccak256("trained"))
        );
        // It never reveals a vote it committed: slashed at the fabrication rate, the two who
        // trained are paid.
        uint256 pool = bsm.getPool(ops[2]).totalAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(ops[2]).totalAssets, pool - pool * 1000 / 10000);
        vm.assertEq(bsm.creditOf(ops[0]), PRICE * 40 / 100);
        vm.assertEq(bsm.creditOf(ops[2]), 0);
    }

    /// Before every member committed, no vote is visible; after the deadline nobody commits.
    function test_voteCopying_nothingToCopyBeforeCommitting() public {
        (uint256 jobId, address[] memory ops) = runningJob(3, 1);
        uint32[] memory p = fullParticipation(jobId);
        submit(jobId, ops[0], keccak256("trained"), p);
        submit(jobId, ops[1], keccak256("trained"), p);
        uint256 deadline = bsm.epochDeadline(jobId);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.RevealNotOpen.selector, deadline, block.timestamp));
        bsm.revealCheckpoint(
            jobId, 0, keccak256("trained"), p, transcriptOf(ops[0]), saltOf(ops[0], keccak256("trained"))
        );
        vm.warp(deadline + 1);
        reveal(jobId); // the votes are public now
        vm.prank(ops[2]);
        vm.expectRevert(abi.encodeWithSelector(I.DeadlinePassed.selector, deadline, deadline + 1));
        bsm.commitCheckpoint(jobId, 0, keccak256("copied"));
    }
}

/// A caller's broken job (dataset or model missing or failing its hash) used to get its
/// operators slashed for dropout. Members now vote UNWORKABLE: with a 2/3 quorum the job is
/// aborted, nobody is slashed, the voters get a compensation below an epoch's pay and the
/// caller the rest of the escrow.
contract UnworkableEpochTest is BaseTest {
    function test_brokenJob_abortedNobodySlashed() public {
        address[] memory ops = registerN(3);
        vm.prank(staker);
        bsm.delegate{value: 5 ether}(ops[2]);
        uint256 jobId = createJob(spec(3, 3, 2));
        joinAll(jobId, ops);
        uint32[] memory none = new uint32[](0);
        submit(jobId, ops[0], bsm.UNWORKABLE(), none);
        submit(jobId, ops[1], bsm.UNWORKABLE(), none);
        // ops[2] is silent: with the quorum saying the epoch cannot be done, not slashed either.
        uint256[] memory pools = new uint256[](3);
        for (uint256 i; i < 3; ++i) {
            pools[i] = bsm.getPool(ops[i]).totalAssets;
        }
        uint256 comp = PRICE * COMP_BPS / 10000;
        uint256 refund = escrowOf(spec(3, 3, 2)) - 2 * comp;
        reveal(jobId);
        vm.warp(bsm.revealDeadline(jobId) + 1);
        vm.expectEmit();
        emit I.JobAborted(jobId, 0, 2, comp, refund);
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Failed));
        for (uint256 i; i < 3; ++i) {
            vm.assertEq(bsm.getPool(ops[i]).totalAssets, pools[i], "slashed for the caller's broken job");
            vm.assertEq(bsm.bondedOf(ops[i]), 0);
        }
        vm.assertEq(bsm.creditOf(ops[0]), comp);
        vm.assertEq(bsm.creditOf(ops[2]), 0);
        vm.assertEq(bsm.creditOf(caller), refund);
        vm.assertEq(bsm.creditOf(treasury), 0);
        assertConserved();
    }

    /// Voting a workable epoch unworkable pays less than training it.
    function testFuzz_unworkablePaysLessThanTraining(uint16 compBps) public {
        I.Params memory prm = defaultParams();
        prm.unworkableCompBps = uint16(bound(compBps, 0, prm.operatorBps - 1));
        bsm = deployBSM(prm);
        (uint256 jobId, address[] memory ops) = runningJob(2, 1);
        submit(jobId, ops[0], bsm.UNWORKABLE(), new uint32[](0));
        submit(jobId, ops[1], bsm.UNWORKABLE(), new uint32[](0));
        finalize(jobId);
        vm.assertLt(bsm.creditOf(ops[0]), PRICE * prm.operatorBps / 10000, "unworkable paid as much as training");
        assertConserved();
    }

    /// One member that cannot work while a quorum trains is a dropout, not a fabricator.
    function test_minorityUnworkable_isDropout() public {
        (uint256 jobId, address[] memory ops) = runningJob(3, 1);
        uint32[] memory p = fullParticipation(jobId);
        submit(jobId, ops[0], keccak256("trained"), p);
        submit(jobId, ops[1], keccak256("trained"), p);
        submit(jobId, ops[2], bsm.UNWORKABLE(), p);
        uint256 pool = bsm.getPool(ops[2]).totalAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(ops[2]).totalAssets, pool - pool * 500 / 10000);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        vm.assertEq(bsm.creditOf(ops[0]), PRICE * 40 / 100);
    }
}
