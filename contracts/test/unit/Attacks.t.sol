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

        // The attacker votes the victims' expected (checkpoint, participation) in its own job.
        uint32[] memory expected = fullParticipation(victimJob); // [10, 10, 10]
        submit(attackJob, attackers[0], keccak256("victim-ckpt"), expected);

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
        (uint256 jobId, address[] memory ops) = runningJob(1, 3);
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
        uint256 job2 = createJob(spec(1, 1, 1));
        vm.prank(ops[0]);
        bsm.joinJob(job2);
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
/// the treasury: the caller, and every member, gets nothing from a slash; an outside finalizer
/// gets at most `maxReporterBounty`.
contract HoneypotJobTest is BaseTest {
    function test_honeypotJob_tooShortEpochRejected() public {
        I.JobSpec memory s = spec(1, 1, 1);
        s.epochDuration = 1;
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidEpochDuration.selector, 1, MIN_EPOCH, UNBONDING / 4 - GRACE));
        bsm.createJob{value: escrowOf(s)}(s);
    }

    function test_honeypotJob_callerCannotProfit() public {
        address victim = op(1);
        register(victim, MIN_STAKE);
        vm.prank(staker);
        bsm.delegate{value: 50 ether}(victim); // the pool a honeypot would target
        I.JobSpec memory s = spec(1, 1, 1);
        s.epochDuration = MIN_EPOCH; // the shortest allowed
        uint256 callerFunds = caller.balance;
        uint256 jobId = createJob(s);
        uint256 joinedAt = block.timestamp;
        vm.prank(victim);
        bsm.joinJob(jobId);
        // The operator has the grace plus the whole epoch: nothing is finalizable before.
        vm.assertEq(bsm.epochDeadline(jobId), joinedAt + GRACE + MIN_EPOCH);
        vm.warp(joinedAt + GRACE + MIN_EPOCH);
        vm.prank(caller);
        vm.expectRevert();
        bsm.finalizeEpoch(jobId, 0);
        // It stays offline; the caller finalizes after the deadline.
        vm.warp(joinedAt + GRACE + MIN_EPOCH + 1);
        uint256 pool = bsm.getPool(victim).totalAssets;
        uint256 treasuryBefore = bsm.creditOf(treasury);
        vm.prank(caller);
        bsm.finalizeEpoch(jobId, 0);
        uint256 slashed = pool - bsm.getPool(victim).totalAssets;
        vm.assertTrue(slashed > 0);
        vm.assertEq(bsm.creditOf(treasury) - treasuryBefore, slashed, "slash to the treasury");
        // The slashed member left: the job waits Open; the caller cancels for its escrow back
        // and ends with no more than it started with.
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Open));
        vm.prank(caller);
        bsm.cancelJob(jobId);
        vm.prank(caller);
        bsm.withdraw();
        vm.assertLe(caller.balance, callerFunds, "the caller profited from the slash");
        assertConserved();
    }

    /// An outside finalizer earns at most `maxReporterBounty` however large the slash.
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
        vm.assertLe(bsm.creditOf(reporter), MAX_BOUNTY, "finalizer reward above the cap");
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
        I.JobSpec memory s = spec(1, 1, 1);
        s.epochDuration = uint64(UNBONDING / 4 - GRACE); // the longest allowed
        uint256 jobId = createJob(s);
        vm.prank(a);
        bsm.joinJob(jobId);
        // Both queue everything they can right away and go offline.
        vm.prank(a);
        bsm.unstake(MIN_STAKE);
        vm.prank(staker);
        bsm.undelegate(a, 10 ether);
        uint256 deadline = bsm.epochDeadline(jobId);
        vm.warp(deadline + 1);
        vm.prank(staker);
        vm.expectRevert();
        bsm.withdrawUnbonded(a);
        uint256 before = bsm.getPool(a).unbondingAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(a).unbondingAssets, before - before * 500 / 10000, "unbonding stake slashed");
        assertConserved();
    }

    /// An epoch longer than unbondingPeriod / 4 - startGrace cannot be created.
    function testFuzz_epochFitsInUnbonding(uint64 duration) public {
        I.JobSpec memory s = spec(1, 1, 1);
        s.epochDuration = duration;
        vm.prank(caller);
        if (duration < MIN_EPOCH || duration > UNBONDING / 4 - GRACE) vm.expectRevert();
        bsm.createJob{value: escrowOf(s)}(s);
    }
}
