// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

contract CreateJobTest is BaseTest {
    function test_escrowsAndStoresSpec() public {
        I.JobSpec memory s = spec(2, 4, 3);
        uint256 escrow = escrowOf(s);
        vm.expectEmit();
        emit I.JobCreated(1, caller, I.Method.CPT, escrow);
        uint256 jobId = createJob(s);
        (I.JobSpec memory got, I.JobState memory st) = bsm.getJob(jobId);
        vm.assertEq(got.datasetUri, s.datasetUri);
        vm.assertEq(got.stepsPerEpoch, 40);
        vm.assertEq(st.caller, caller);
        vm.assertEq(uint8(st.status), uint8(I.JobStatus.Open));
        vm.assertEq(st.escrow, escrow);
        vm.assertEq(st.checkpoint, s.modelHash);
        vm.assertEq(address(bsm).balance, escrow);
        assertConserved();
    }

    function test_revert_WrongEscrow() public {
        I.JobSpec memory s = spec(2, 4, 3);
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.WrongEscrow.selector, escrowOf(s), 1));
        bsm.createJob{value: 1}(s);
    }

    function test_revert_ZeroValue_price() public {
        I.JobSpec memory s = spec(2, 4, 3);
        s.pricePerOperatorEpoch = 0;
        vm.prank(caller);
        vm.expectRevert(I.ZeroValue.selector);
        bsm.createJob(s);
    }

    function test_revert_InvalidOperatorRange() public {
        I.JobSpec memory s = spec(3, 2, 1);
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidOperatorRange.selector, 3, 2, 32));
        bsm.createJob(s);
        s = spec(2, 33, 1);
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidOperatorRange.selector, 2, 33, 32));
        bsm.createJob(s);
        // Every epoch needs two members at least: nobody certifies its own checkpoint.
        s = spec(1, 2, 1);
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidOperatorRange.selector, 1, 2, 32));
        bsm.createJob(s);
    }

    function test_revert_InvalidSchedule() public {
        I.JobSpec memory s = spec(2, 2, 1);
        s.syncInterval = 41;
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidSchedule.selector, 1, 40, 41));
        bsm.createJob(s);
    }

    function test_revert_InvalidCompression() public {
        I.JobSpec memory s = spec(2, 2, 1);
        s.quantBits = 3;
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidCompression.selector, 4, 3));
        bsm.createJob(s);
    }

    function test_revert_InvalidEpochDuration() public {
        I.JobSpec memory s = spec(2, 2, 1);
        s.epochDuration = MIN_EPOCH - 1;
        uint256 max = UNBONDING / 4 - GRACE - REVEAL_WINDOW;
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidEpochDuration.selector, MIN_EPOCH - 1, MIN_EPOCH, max));
        bsm.createJob(s);
        s.epochDuration = uint64(max + 1);
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidEpochDuration.selector, max + 1, MIN_EPOCH, max));
        bsm.createJob(s);
    }

    function testFuzz_escrow(uint256 price, uint8 maxOps, uint32 epochs) public {
        price = bound(price, 1, 1e24);
        maxOps = uint8(bound(maxOps, 2, 32));
        epochs = uint32(bound(epochs, 1, 1000));
        I.JobSpec memory s = spec(2, maxOps, epochs);
        s.pricePerOperatorEpoch = price;
        uint256 escrow = price * maxOps * epochs;
        vm.deal(caller, escrow);
        vm.prank(caller);
        uint256 jobId = bsm.createJob{value: escrow}(s);
        vm.assertEq(state(jobId).escrow, escrow);
        assertConserved();
    }
}

contract CancelJobTest is BaseTest {
    function test_refundsInFull() public {
        I.JobSpec memory s = spec(3, 4, 2);
        uint256 jobId = createJob(s);
        address[] memory ops = registerN(1);
        joinAll(jobId, ops);
        vm.prank(caller);
        bsm.cancelJob(jobId);
        vm.assertEq(bsm.creditOf(caller), escrowOf(s));
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Cancelled));
        vm.assertEq(bsm.getOperator(ops[0]).activeJobs, 0);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 0);
        assertConserved();
    }

    function test_revert_NotJobCaller() public {
        uint256 jobId = createJob(spec(3, 4, 2));
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotJobCaller.selector, staker, caller));
        bsm.cancelJob(jobId);
    }

    function test_revert_JobEnded_cancelled() public {
        uint256 jobId = createJob(spec(3, 4, 2));
        vm.prank(caller);
        bsm.cancelJob(jobId);
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.JobEnded.selector, jobId, I.JobStatus.Cancelled));
        bsm.cancelJob(jobId);
    }

    function test_revert_JobEnded_completed() public {
        (uint256 jobId,) = runningJob(2, 1);
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.JobEnded.selector, jobId, I.JobStatus.Completed));
        bsm.cancelJob(jobId);
    }

    function test_revert_UnknownJob() public {
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.UnknownJob.selector, 99));
        bsm.cancelJob(99);
    }

    /// A job that lost its members waits `openTimeout` unpaid; then anyone may fail it, and
    /// the caller (only the caller) gets the remaining escrow back.
    function test_anyoneFailsAfterOpenTimeout() public {
        (uint256 jobId, address[] memory ops) = runningJob(2, 3);
        vm.prank(ops[0]);
        bsm.leaveJob(jobId);
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Open));
        uint256 timeoutAt = block.timestamp + OPEN_TIMEOUT;
        vm.prank(reporter);
        vm.expectRevert(abi.encodeWithSelector(I.OpenTimeoutPending.selector, jobId, timeoutAt, block.timestamp));
        bsm.cancelJob(jobId);
        vm.warp(timeoutAt + 1);
        uint256 escrow = state(jobId).escrow;
        vm.assertEq(escrow, PRICE * 2 * 2, "two unpaid epochs left");
        uint256 callerBefore = bsm.creditOf(caller);
        uint256 reporterBefore = bsm.creditOf(reporter); // its finalizer's reward for epoch 0
        vm.expectEmit();
        emit I.JobFailed(jobId, escrow);
        vm.prank(reporter);
        bsm.cancelJob(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Failed));
        vm.assertEq(bsm.creditOf(caller) - callerBefore, escrow);
        vm.assertEq(bsm.creditOf(reporter), reporterBefore, "nothing for failing the job");
        vm.assertEq(bsm.bondedOf(ops[1]), 0, "bond released");
        assertConserved();
    }

    /// A stranger cannot end a job that never started (only its caller cancels it).
    function test_revert_NotJobCaller_neverStarted() public {
        uint256 jobId = createJob(spec(2, 4, 2));
        vm.warp(block.timestamp + OPEN_TIMEOUT + 1);
        vm.prank(reporter);
        vm.expectRevert(abi.encodeWithSelector(I.NotJobCaller.selector, reporter, caller));
        bsm.cancelJob(jobId);
    }
}

/// `cancelJob` by the caller of a running job: the epoch in progress settles as usual (its
/// members paid), then the job closes `Cancelled` and the unearned escrow goes back, to the wei.
contract CancelRunningJobTest is BaseTest {
    function test_endsAtTheBoundary_exactRefund() public {
        (uint256 jobId, address[] memory ops) = runningJob(2, 3);
        vm.expectEmit();
        emit I.CancelRequested(jobId, 0);
        vm.prank(caller);
        bsm.cancelJob(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Running), "the epoch in progress runs on");
        vm.assertTrue(bsm.cancelRequested(jobId));
        submitAll(jobId, keccak256("c0"));
        vm.expectEmit();
        emit I.JobCancelled(jobId, PRICE * 2 * 2);
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Cancelled));
        vm.assertEq(state(jobId).epoch, 1, "epoch 0 finalized");
        vm.assertEq(bsm.epochCheckpoint(jobId, 0), keccak256("c0"));
        vm.assertEq(bsm.creditOf(caller), PRICE * 2 * 2, "two unearned epochs back");
        vm.assertEq(state(jobId).escrow, 0);
        for (uint256 i; i < 2; ++i) {
            vm.assertEq(bsm.creditOf(ops[i]), PRICE * 40 / 100, "member paid for epoch 0");
            vm.assertEq(bsm.bondedOf(ops[i]), 0, "bond released");
            vm.assertEq(bsm.getOperator(ops[i]).activeJobs, 0);
        }
        vm.assertEq(bsm.getMembers(jobId).length, 0);
        assertConserved();
    }

    /// Cancelling after the work is revealed does not dodge paying for it.
    function test_cancelAfterTheVotes_epochStillPaid() public {
        (uint256 jobId, address[] memory ops) = runningJob(3, 2);
        submitAll(jobId, keccak256("c0"));
        vm.prank(caller);
        bsm.cancelJob(jobId);
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Cancelled));
        for (uint256 i; i < 3; ++i) {
            vm.assertEq(bsm.creditOf(ops[i]), PRICE * 40 / 100);
        }
        vm.assertEq(bsm.creditOf(caller), PRICE * 3);
        assertConserved();
    }

    /// Silent members are slashed as usual; an epoch without quorum earns nothing, so the
    /// whole remaining escrow goes back and no other attempt starts.
    function test_failedEpoch_slashesDropouts_refundsAll() public {
        (uint256 jobId, address[] memory ops) = runningJob(3, 2);
        vm.prank(caller);
        bsm.cancelJob(jobId);
        submit(jobId, ops[0], keccak256("c0"), fullParticipation(jobId));
        uint256 pool = bsm.getPool(ops[1]).totalAssets;
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Cancelled));
        vm.assertLt(bsm.getPool(ops[1]).totalAssets, pool, "silent member slashed");
        vm.assertEq(bsm.creditOf(caller), PRICE * 3 * 2);
        vm.assertEq(bsm.creditOf(ops[0]), 0);
        assertConserved();
    }

    /// A pending joiner is released, not started.
    function test_pendingJoinerReleased() public {
        address[] memory ops = registerN(2);
        uint256 jobId = createJob(spec(2, 3, 3));
        joinAll(jobId, ops);
        address late = op(9);
        register(late, MIN_STAKE);
        vm.prank(caller);
        bsm.cancelJob(jobId);
        vm.prank(late);
        bsm.joinJob(jobId);
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Cancelled));
        vm.assertEq(bsm.bondedOf(late), 0);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 0);
        assertConserved();
    }

    /// Cancelling in the last epoch changes nothing: the job completes.
    function test_lastEpoch_completes() public {
        (uint256 jobId,) = runningJob(2, 1);
        vm.prank(caller);
        bsm.cancelJob(jobId);
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        vm.assertEq(bsm.creditOf(caller), 0);
    }

    function test_revert_CancelAlreadyRequested() public {
        (uint256 jobId,) = runningJob(2, 3);
        vm.prank(caller);
        bsm.cancelJob(jobId);
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.CancelAlreadyRequested.selector, jobId, 0));
        bsm.cancelJob(jobId);
    }

    function test_revert_NotJobCaller() public {
        (uint256 jobId, address[] memory ops) = runningJob(2, 3);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.NotJobCaller.selector, ops[0], caller));
        bsm.cancelJob(jobId);
        vm.assertFalse(bsm.cancelRequested(jobId));
    }

    /// Cancelled in epoch `at` of `epochs` with `n` members: epochs 0..at are paid, the rest
    /// (and the seats never filled) refunded to the wei.
    function testFuzz_exactRefund(uint8 nSeed, uint8 maxSeed, uint8 epochSeed, uint8 atSeed) public {
        uint256 n = bound(nSeed, 2, 5);
        uint256 maxOps = bound(maxSeed, n, 6);
        uint32 epochs = uint32(bound(epochSeed, 1, 5));
        uint256 at = bound(atSeed, 0, epochs - 1);
        address[] memory ops = registerN(n);
        I.JobSpec memory s = spec(uint8(n), uint8(maxOps), epochs);
        uint256 jobId = createJob(s);
        joinAll(jobId, ops);
        for (uint256 e; e < at; ++e) {
            submitAll(jobId, keccak256(abi.encode(e)));
            finalize(jobId);
        }
        vm.prank(caller);
        bsm.cancelJob(jobId);
        submitAll(jobId, keccak256(abi.encode(at)));
        finalize(jobId);
        bool last = at + 1 == epochs;
        vm.assertEq(uint8(status(jobId)), uint8(last ? I.JobStatus.Completed : I.JobStatus.Cancelled));
        uint256 paid = PRICE * n * (at + 1);
        vm.assertEq(bsm.creditOf(caller), escrowOf(s) - paid, "refund = escrow - paid epochs");
        for (uint256 i; i < n; ++i) {
            vm.assertEq(bsm.creditOf(ops[i]), PRICE * 40 / 100 * (at + 1));
            vm.assertEq(bsm.bondedOf(ops[i]), 0);
        }
        assertConserved();
    }
}

contract JoinJobTest is BaseTest {
    function test_startsEpochZeroAtMinOperators() public {
        address[] memory ops = registerN(3);
        uint256 jobId = createJob(spec(2, 4, 2));
        vm.prank(ops[0]);
        bsm.joinJob(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Open));
        vm.prank(ops[1]);
        bsm.joinJob(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Running));
        address[] memory m = bsm.getMembers(jobId);
        vm.assertEq(m.length, 2);
        vm.assertEq(m[0], ops[0]);
        vm.assertEq(m[1], ops[1]);
        vm.assertEq(bsm.epochDeadline(jobId), block.timestamp + GRACE + EPOCH);
        // A third operator waits for the boundary.
        vm.prank(ops[2]);
        bsm.joinJob(jobId);
        vm.assertEq(bsm.getMembers(jobId).length, 2);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 1);
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        vm.assertEq(bsm.getMembers(jobId).length, 3);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 0);
    }

    function test_revert_NotRegistered() public {
        uint256 jobId = createJob(spec(2, 4, 2));
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotRegistered.selector, staker));
        bsm.joinJob(jobId);
    }

    function test_revert_AlreadyMember() public {
        address[] memory ops = registerN(1);
        uint256 jobId = createJob(spec(2, 4, 2));
        joinAll(jobId, ops);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.AlreadyMember.selector, jobId, ops[0]));
        bsm.joinJob(jobId);
    }

    function test_revert_JobFull() public {
        address[] memory ops = registerN(3);
        uint256 jobId = createJob(spec(2, 2, 2));
        vm.prank(ops[0]);
        bsm.joinJob(jobId);
        vm.prank(ops[1]);
        bsm.joinJob(jobId);
        vm.prank(ops[2]);
        vm.expectRevert(abi.encodeWithSelector(I.JobFull.selector, jobId, 2, 2));
        bsm.joinJob(jobId);
    }

    function test_revert_PriceBelowAsk() public {
        address a = op(1);
        vm.deal(a, MIN_STAKE);
        vm.prank(a);
        bsm.registerOperator{value: MIN_STAKE}(peerKeyOf(a), addrsOf(1), "", 1 ether);
        uint256 jobId = createJob(spec(2, 2, 2));
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.PriceBelowAsk.selector, PRICE, 1 ether));
        bsm.joinJob(jobId);
    }

    function test_revert_InsufficientFreeStake() public {
        address[] memory ops = registerN(1);
        vm.prank(core);
        bsm.onSlash(0, abi.encode(ops[0]), 10);
        uint256 jobId = createJob(spec(2, 2, 2));
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.InsufficientFreeStake.selector, 0.9 ether, MIN_STAKE));
        bsm.joinJob(jobId);
    }

    /// Each seat bonds its own `seatBond`: 1 ETH of self-stake holds two 0.5 ETH seats, not three.
    function test_revert_InsufficientFreeStake_seatsCostStake() public {
        address[] memory ops = registerN(1);
        for (uint256 i; i < 2; ++i) {
            uint256 id = createJob(spec(2, 2, 1));
            vm.prank(ops[0]);
            bsm.joinJob(id);
        }
        vm.assertEq(bsm.bondedOf(ops[0]), 2 * SEAT_BOND);
        uint256 third = createJob(spec(2, 2, 1));
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.InsufficientFreeStake.selector, MIN_STAKE, 3 * SEAT_BOND));
        bsm.joinJob(third);
    }

    function test_revert_JobNotOpen() public {
        address[] memory ops = registerN(3);
        uint256 jobId = createJob(spec(2, 2, 1));
        vm.prank(ops[0]);
        bsm.joinJob(jobId);
        vm.prank(ops[1]);
        bsm.joinJob(jobId);
        submitAll(jobId, keccak256("c"));
        finalize(jobId);
        vm.prank(ops[2]);
        vm.expectRevert(abi.encodeWithSelector(I.JobNotOpen.selector, jobId, I.JobStatus.Completed));
        bsm.joinJob(jobId);
    }

    function test_revert_UnknownJob() public {
        address[] memory ops = registerN(1);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.UnknownJob.selector, 5));
        bsm.joinJob(5);
    }
}

contract LeaveJobTest is BaseTest {
    function test_leavesAtBoundary() public {
        address[] memory ops = registerN(3);
        uint256 jobId = createJob(spec(2, 3, 3));
        joinAll(jobId, ops); // the second join starts epoch 0; the third waits for epoch 1
        vm.prank(ops[0]);
        bsm.leaveJob(jobId);
        vm.assertTrue(bsm.isLeaving(jobId, ops[0]));
        vm.assertEq(bsm.getMembers(jobId).length, 2);
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        // ops[0] left, ops[2] came in: still minOperators (2), the job goes on.
        address[] memory m = bsm.getMembers(jobId);
        vm.assertEq(m.length, 2);
        vm.assertTrue(m[0] == ops[1] && m[1] == ops[2]);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Running));
        vm.assertEq(state(jobId).epoch, 1);
        vm.assertEq(bsm.getOperator(ops[0]).activeJobs, 0);
    }

    /// Attack 3 (a lone member certifying itself): with one member left the job waits Open,
    /// unpaid, until a second one joins.
    function test_waitsOpenBelowMinOperators() public {
        (uint256 jobId, address[] memory ops) = runningJob(2, 3);
        vm.prank(ops[0]);
        bsm.leaveJob(jobId);
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Open));
        vm.assertEq(bsm.getMembers(jobId).length, 1);
        vm.prank(ops[1]);
        vm.expectRevert(abi.encodeWithSelector(I.JobNotRunning.selector, jobId, I.JobStatus.Open));
        bsm.commitCheckpoint(jobId, 1, keccak256("alone"));
        // A second operator restarts it at epoch 1.
        address d = op(4);
        register(d, MIN_STAKE);
        vm.prank(d);
        bsm.joinJob(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Running));
        vm.assertEq(state(jobId).epoch, 1);
    }

    function test_fullJobRejectsJoin() public {
        (uint256 jobId,) = runningJob(3, 3);
        address d = op(4);
        register(d, MIN_STAKE);
        vm.prank(d);
        vm.expectRevert(abi.encodeWithSelector(I.JobFull.selector, jobId, 3, 3));
        bsm.joinJob(jobId);
    }

    function test_pendingLeavesImmediately() public {
        address[] memory ops = registerN(2);
        uint256 jobId = createJob(spec(2, 4, 2));
        vm.prank(ops[0]);
        bsm.joinJob(jobId);
        vm.prank(ops[0]);
        bsm.leaveJob(jobId);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 0);
        vm.assertEq(bsm.getOperator(ops[0]).activeJobs, 0);
    }

    function test_revert_NotMember() public {
        uint256 jobId = createJob(spec(2, 4, 2));
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotMember.selector, jobId, staker));
        bsm.leaveJob(jobId);
    }

    function test_revert_AlreadyLeaving() public {
        (uint256 jobId, address[] memory ops) = runningJob(2, 2);
        vm.prank(ops[0]);
        bsm.leaveJob(jobId);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.AlreadyLeaving.selector, jobId, ops[0]));
        bsm.leaveJob(jobId);
    }
}

/// An operator that will not take a job says why on chain, so the caller reads it after the
/// operator's node is gone (`dtrain job status`).
contract DeclineJobTest is BaseTest {
    uint256 internal jobId;

    function setUp() public override {
        super.setUp();
        register(op(1), MIN_STAKE);
        jobId = createJob(spec(2, 2, 1));
    }

    function test_declineJob_emitsTheReasonAndChangesNothing() public {
        I.JobState memory before = state(jobId);
        vm.expectEmit();
        emit I.JobDeclined(jobId, op(1), "ask", "the job pays 0.01 ETH, our ask is 0.02 ETH");
        vm.prank(op(1));
        bsm.declineJob(jobId, "ask", "the job pays 0.01 ETH, our ask is 0.02 ETH");
        vm.assertEq(abi.encode(state(jobId)), abi.encode(before));
        assertConserved();
    }

    function test_revert_NotRegistered() public {
        vm.expectRevert(abi.encodeWithSelector(I.NotRegistered.selector, op(2)));
        vm.prank(op(2));
        bsm.declineJob(jobId, "ask", "");
    }

    function test_revert_UnknownJob() public {
        vm.expectRevert(abi.encodeWithSelector(I.UnknownJob.selector, 99));
        vm.prank(op(1));
        bsm.declineJob(99, "ask", "");
    }

    function test_revert_DetailTooLong() public {
        bytes memory long = new bytes(257);
        vm.expectRevert(abi.encodeWithSelector(I.DetailTooLong.selector, 257, 256));
        vm.prank(op(1));
        bsm.declineJob(jobId, "ask", string(long));
    }
}
