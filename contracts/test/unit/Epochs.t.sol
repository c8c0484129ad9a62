// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

contract SubmitCheckpointTest is BaseTest {
    uint256 internal jobId;
    address[] internal ops;

    function setUp() public override {
        super.setUp();
        (jobId, ops) = runningJob(3, 2);
    }

    function test_recordsVote() public {
        uint32[] memory p = fullParticipation(jobId);
        bytes32 key = keccak256(abi.encode(keccak256("c0"), p));
        vm.expectEmit();
        emit I.CheckpointSubmitted(jobId, 0, ops[0], keccak256("c0"), key);
        submit(jobId, ops[0], keccak256("c0"), p);
        (bytes32 h, bytes32 k) = bsm.submissionOf(jobId, ops[0]);
        vm.assertEq(h, keccak256("c0"));
        vm.assertEq(k, key);
        vm.assertEq(bsm.submittedCount(jobId), 1);
    }

    function test_revert_AlreadySubmitted() public {
        uint32[] memory p = fullParticipation(jobId);
        submit(jobId, ops[0], keccak256("c0"), p);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.AlreadySubmitted.selector, jobId, 0, ops[0]));
        bsm.submitCheckpoint(jobId, 0, keccak256("c1"), p);
    }

    function test_revert_NotMember() public {
        uint32[] memory p = fullParticipation(jobId);
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotMember.selector, jobId, staker));
        bsm.submitCheckpoint(jobId, 0, keccak256("c0"), p);
    }

    function test_revert_WrongEpoch() public {
        uint32[] memory p = fullParticipation(jobId);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.WrongEpoch.selector, jobId, 1, 0));
        bsm.submitCheckpoint(jobId, 1, keccak256("c0"), p);
    }

    function test_revert_DeadlinePassed() public {
        uint32[] memory p = fullParticipation(jobId);
        uint256 deadline = block.timestamp + GRACE + EPOCH;
        vm.warp(deadline + 1);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.DeadlinePassed.selector, deadline, deadline + 1));
        bsm.submitCheckpoint(jobId, 0, keccak256("c0"), p);
    }

    function test_revert_ZeroCheckpoint() public {
        uint32[] memory p = fullParticipation(jobId);
        vm.prank(ops[0]);
        vm.expectRevert(I.ZeroCheckpoint.selector);
        bsm.submitCheckpoint(jobId, 0, bytes32(0), p);
    }

    function test_revert_ParticipationLength() public {
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.ParticipationLength.selector, 2, 3));
        bsm.submitCheckpoint(jobId, 0, keccak256("c0"), new uint32[](2));
    }

    function test_revert_ParticipationTooHigh() public {
        uint32[] memory p = fullParticipation(jobId);
        p[1] = 11; // 40 steps / K=4 = 10 rounds
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.ParticipationTooHigh.selector, 1, 11, 10));
        bsm.submitCheckpoint(jobId, 0, keccak256("c0"), p);
    }

    function test_revert_JobNotRunning() public {
        uint256 open = createJob(spec(2, 2, 1));
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.JobNotRunning.selector, open, I.JobStatus.Open));
        bsm.submitCheckpoint(open, 0, keccak256("c0"), new uint32[](0));
    }

    function testFuzz_submitTiming(uint256 dt) public {
        dt = bound(dt, 0, 2 * EPOCH);
        vm.warp(block.timestamp + dt);
        uint32[] memory p = fullParticipation(jobId);
        if (dt > GRACE + EPOCH) vm.expectRevert();
        vm.prank(ops[0]);
        bsm.submitCheckpoint(jobId, 0, keccak256("c0"), p);
    }
}

contract FinalizeEpochTest is BaseTest {
    uint256 internal jobId;
    address[] internal ops;

    function setUp() public override {
        super.setUp();
        ops = registerN(3);
        vm.prank(staker);
        bsm.delegate{value: 1 ether}(ops[0]); // before the job: earns from its first epoch
        jobId = createJob(spec(3, 3, 2));
        joinAll(jobId, ops);
    }

    function test_paysExactSplit() public {
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        // 3 paid operator-epochs: 40% each operator, 20% pool, 20% + 20% shared.
        vm.assertEq(bsm.creditOf(ops[1]), PRICE * 40 / 100);
        vm.assertEq(bsm.creditOf(developer), 3 * PRICE * 20 / 100);
        vm.assertEq(bsm.creditOf(treasury), 3 * PRICE * 20 / 100);
        vm.assertEq(bsm.pendingRewards(ops[0], staker), PRICE * 20 / 100 / 2);
        vm.assertEq(bsm.pendingRewards(ops[0], ops[0]), PRICE * 20 / 100 / 2);
        vm.assertEq(bsm.pendingRewards(ops[1], ops[1]), PRICE * 20 / 100);
        I.JobState memory st = state(jobId);
        vm.assertEq(st.epoch, 1);
        vm.assertEq(st.checkpoint, keccak256("c0"));
        vm.assertEq(st.escrow, PRICE * 3 * 2 - 3 * PRICE);
        vm.assertEq(bsm.epochCheckpoint(jobId, 0), keccak256("c0"));
        assertConserved();
    }

    function test_completesAndRefunds() public {
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        submitAll(jobId, keccak256("c1"));
        vm.expectEmit();
        emit I.JobCompleted(jobId, keccak256("c1"), 0);
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        vm.assertEq(bsm.getOperator(ops[0]).activeJobs, 0);
        vm.assertEq(bsm.getMembers(jobId).length, 0);
        assertConserved();
    }

    function test_slashesFabricationDropoutAndSyncFailure() public {
        // 4th operator so that 3 honest of 4 reach the 2/3 quorum.
        address d = op(4);
        register(d, MIN_STAKE);
        uint256 job2 = createJob(spec(4, 4, 2));
        joinAll(job2, ops);
        vm.prank(d);
        bsm.joinJob(job2);
        address[] memory m = bsm.getMembers(job2);
        uint32[] memory p = fullParticipation(job2);
        p[3] = 4; // member 3 synced 4 of 10 rounds, below the 50% threshold
        submit(job2, m[0], keccak256("good"), p);
        submit(job2, m[1], keccak256("good"), p);
        submit(job2, m[2], keccak256("forged"), p);
        submit(job2, m[3], keccak256("good"), p);
        uint256 stake2 = bsm.getPool(m[2]).totalAssets;
        uint256 stake3 = bsm.getPool(m[3]).totalAssets;
        uint256 callerBefore = bsm.creditOf(caller);
        uint256 treasuryBefore = bsm.creditOf(treasury);
        vm.prank(reporter);
        bsm.finalizeEpoch(job2, 0);
        uint256 fab = stake2 * 1000 / 10000;
        uint256 sync = stake3 * 200 / 10000;
        vm.assertEq(bsm.getPool(m[2]).totalAssets, stake2 - fab);
        vm.assertEq(bsm.getPool(m[3]).totalAssets, stake3 - sync);
        vm.assertEq(bsm.creditOf(m[2]), 0);
        vm.assertEq(bsm.creditOf(m[3]), 0);
        vm.assertEq(bsm.creditOf(m[0]), PRICE * 40 / 100);
        uint256 bounty = (fab + sync) * 1000 / 10000;
        if (bounty > MAX_BOUNTY) bounty = MAX_BOUNTY;
        vm.assertEq(bsm.creditOf(reporter), bounty);
        vm.assertEq(bsm.creditOf(caller), callerBefore, "the caller gains nothing from a slash");
        // Treasury: the slashes less the bounty, plus its 20% of the 2 paid operator-epochs.
        vm.assertEq(bsm.creditOf(treasury) - treasuryBefore, fab + sync - bounty + 2 * PRICE * 20 / 100);
        // Slashed members leave at the boundary; the 2 honest ones go on.
        vm.assertEq(bsm.getMembers(job2).length, 2);
        vm.assertEq(uint8(status(job2)), uint8(I.JobStatus.Running));
        vm.assertFalse(bsm.getMembers(job2)[0] == m[2] || bsm.getMembers(job2)[1] == m[2]);
        assertConserved();
    }

    function test_dropoutSlashedAfterDeadline() public {
        uint32[] memory p = fullParticipation(jobId);
        submit(jobId, ops[0], keccak256("c0"), p);
        submit(jobId, ops[1], keccak256("c0"), p);
        uint256 deadline = block.timestamp + GRACE + EPOCH;
        vm.prank(reporter);
        vm.expectRevert(abi.encodeWithSelector(I.EpochNotFinalizable.selector, jobId, 2, 3, deadline));
        bsm.finalizeEpoch(jobId, 0);
        vm.warp(deadline + 1);
        address silent = ops[2];
        uint256 before = bsm.getPool(silent).totalAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(silent).totalAssets, before - before * 500 / 10000);
        vm.assertEq(state(jobId).epoch, 1); // 2 of 3 is a quorum
        assertConserved();
    }

    function test_noQuorumRetriesThenFails() public {
        uint256 escrow = state(jobId).escrow;
        for (uint256 attempt; attempt < 3; ++attempt) {
            uint32[] memory p = fullParticipation(jobId);
            submit(jobId, ops[0], keccak256("a"), p);
            submit(jobId, ops[1], keccak256("b"), p);
            submit(jobId, ops[2], keccak256("c"), p);
            finalize(jobId);
            vm.assertEq(state(jobId).epoch, 0);
        }
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Failed));
        vm.assertEq(bsm.creditOf(caller), escrow);
        vm.assertEq(bsm.getPool(ops[1]).totalAssets, MIN_STAKE); // nobody slashed for mismatch
        assertConserved();
    }

    function test_memberFinalizerEarnsNoBounty() public {
        address[] memory m = bsm.getMembers(jobId);
        uint32[] memory p = fullParticipation(jobId);
        submit(jobId, m[0], keccak256("good"), p);
        submit(jobId, m[1], keccak256("good"), p);
        submit(jobId, m[2], keccak256("forged"), p);
        uint256 fab = bsm.getPool(m[2]).totalAssets * 1000 / 10000;
        uint256 treasuryBefore = bsm.creditOf(treasury);
        vm.prank(m[0]);
        bsm.finalizeEpoch(jobId, 0);
        vm.assertEq(bsm.creditOf(m[0]), PRICE * 40 / 100, "a member earns its pay, no bounty");
        vm.assertEq(bsm.creditOf(caller), 0);
        vm.assertEq(bsm.creditOf(treasury) - treasuryBefore, fab + 2 * PRICE * 20 / 100);
        assertConserved();
    }

    function test_revert_WrongEpoch() public {
        vm.expectRevert(abi.encodeWithSelector(I.WrongEpoch.selector, jobId, 3, 0));
        bsm.finalizeEpoch(jobId, 3);
    }

    function test_revert_JobNotRunning() public {
        uint256 open = createJob(spec(2, 2, 1));
        vm.expectRevert(abi.encodeWithSelector(I.JobNotRunning.selector, open, I.JobStatus.Open));
        bsm.finalizeEpoch(open, 0);
    }

    function test_revert_UnknownJob() public {
        vm.expectRevert(abi.encodeWithSelector(I.UnknownJob.selector, 77));
        bsm.finalizeEpoch(77, 0);
    }

    /// Every paid operator-epoch credits exactly its price across the four recipients.
    function testFuzz_feeSplitSumsToPrice(uint256 price, uint16 a, uint16 b, uint16 c) public {
        price = bound(price, 1, 1e24);
        a = uint16(bound(a, 0, 10000));
        b = uint16(bound(b, 0, 10000 - a));
        c = uint16(bound(c, 0, 10000 - a - b));
        I.Params memory prm = defaultParams();
        (prm.operatorBps, prm.stakerBps, prm.protocolBps, prm.developerBps) = (a, b, c, 10000 - a - b - c);
        bsm = deployBSM(prm);
        address o = op(50);
        register(o, MIN_STAKE);
        I.JobSpec memory s = spec(1, 1, 1);
        s.pricePerOperatorEpoch = price;
        vm.deal(caller, price);
        vm.prank(caller);
        uint256 id = bsm.createJob{value: price}(s);
        vm.prank(o);
        bsm.joinJob(id);
        submitAll(id, keccak256("x"));
        finalize(id);
        uint256 got = bsm.creditOf(o) + bsm.creditOf(treasury) + bsm.creditOf(developer) + bsm.getPool(o).rewardReserve;
        vm.assertEq(got, price, "split != price");
        assertConserved();
    }

    function testFuzz_deadlineTiming(uint256 dt) public {
        dt = bound(dt, 0, 3 * EPOCH);
        vm.warp(block.timestamp + dt);
        if (dt <= GRACE + EPOCH) vm.expectRevert();
        bsm.finalizeEpoch(jobId, 0);
    }
}

