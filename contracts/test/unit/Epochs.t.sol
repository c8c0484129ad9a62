// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

contract CommitCheckpointTest is BaseTest {
    uint256 internal jobId;
    address[] internal ops;

    function setUp() public override {
        super.setUp();
        (jobId, ops) = runningJob(3, 2);
    }

    function commitmentOf(address a, bytes32 h) internal view returns (bytes32) {
        return bsm.commitmentHash(jobId, 0, a, h, fullParticipation(jobId), transcriptOf(a), saltOf(a, h));
    }

    function test_recordsCommitmentHidden() public {
        bytes32 c = commitmentOf(ops[0], keccak256("c0"));
        vm.expectEmit();
        emit I.CheckpointCommitted(jobId, 0, ops[0], c);
        vm.prank(ops[0]);
        bsm.commitCheckpoint(jobId, 0, c);
        (bytes32 commitment, bytes32 h, bytes32 k) = bsm.submissionOf(jobId, ops[0]);
        vm.assertEq(commitment, c);
        vm.assertEq(h, bytes32(0));
        vm.assertEq(k, bytes32(0));
        (uint256 committed, uint256 revealed) = bsm.voteCounts(jobId);
        vm.assertEq(committed, 1);
        vm.assertEq(revealed, 0);
    }

    function test_commitmentHashIsAbiEncoded() public view {
        uint32[] memory p = fullParticipation(jobId);
        vm.assertEq(
            bsm.commitmentHash(jobId, 0, ops[0], keccak256("c0"), p, transcriptOf(ops[0]), bytes32(uint256(7))),
            keccak256(
                abi.encode(jobId, uint256(0), ops[0], keccak256("c0"), p, transcriptOf(ops[0]), bytes32(uint256(7)))
            )
        );
        vm.assertEq(bsm.UNWORKABLE(), bytes32("UNWORKABLE"));
    }

    function test_revert_AlreadyCommitted() public {
        submit(jobId, ops[0], keccak256("c0"), fullParticipation(jobId));
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.AlreadyCommitted.selector, jobId, 0, ops[0]));
        bsm.commitCheckpoint(jobId, 0, keccak256("other"));
    }

    function test_revert_NotMember() public {
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotMember.selector, jobId, staker));
        bsm.commitCheckpoint(jobId, 0, keccak256("c0"));
    }

    function test_revert_WrongEpoch() public {
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.WrongEpoch.selector, jobId, 1, 0));
        bsm.commitCheckpoint(jobId, 1, keccak256("c0"));
    }

    function test_revert_DeadlinePassed() public {
        uint256 deadline = block.timestamp + GRACE + EPOCH;
        vm.warp(deadline + 1);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.DeadlinePassed.selector, deadline, deadline + 1));
        bsm.commitCheckpoint(jobId, 0, keccak256("c0"));
    }

    function test_revert_ZeroCheckpoint() public {
        vm.prank(ops[0]);
        vm.expectRevert(I.ZeroCheckpoint.selector);
        bsm.commitCheckpoint(jobId, 0, bytes32(0));
    }

    function test_revert_JobNotRunning() public {
        uint256 open = createJob(spec(2, 2, 1));
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.JobNotRunning.selector, open, I.JobStatus.Open));
        bsm.commitCheckpoint(open, 0, keccak256("c0"));
    }

    function testFuzz_commitTiming(uint256 dt) public {
        dt = bound(dt, 0, 2 * EPOCH);
        vm.warp(block.timestamp + dt);
        if (dt > GRACE + EPOCH) vm.expectRevert();
        vm.prank(ops[0]);
        bsm.commitCheckpoint(jobId, 0, keccak256("c0"));
    }
}

contract RevealCheckpointTest is BaseTest {
    uint256 internal jobId;
    address[] internal ops;
    uint32[] internal p;

    function setUp() public override {
        super.setUp();
        (jobId, ops) = runningJob(3, 2);
        p = fullParticipation(jobId);
    }

    function commit(address a, bytes32 h) internal {
        bytes32 c = bsm.commitmentHash(jobId, 0, a, h, p, transcriptOf(a), saltOf(a, h));
        vm.prank(a);
        bsm.commitCheckpoint(jobId, 0, c);
    }

    function test_recordsVote() public {
        for (uint256 i; i < 3; ++i) {
            commit(ops[i], keccak256("c0"));
        }
        bytes32 key = keccak256(abi.encode(keccak256("c0"), p));
        vm.expectEmit();
        emit I.CheckpointRevealed(jobId, 0, ops[0], keccak256("c0"), key, transcriptOf(ops[0]));
        vm.prank(ops[0]);
        bsm.revealCheckpoint(jobId, 0, keccak256("c0"), p, transcriptOf(ops[0]), saltOf(ops[0], keccak256("c0")));
        (, bytes32 h, bytes32 k) = bsm.submissionOf(jobId, ops[0]);
        vm.assertEq(h, keccak256("c0"));
        vm.assertEq(k, key);
        (, uint256 revealed) = bsm.voteCounts(jobId);
        vm.assertEq(revealed, 1);
    }

    /// Reveals open only when nobody can commit any more: before the deadline, a reveal while
    /// a member has not committed would let it copy the vote.
    function test_revert_RevealNotOpen() public {
        commit(ops[0], keccak256("c0"));
        uint256 deadline = bsm.epochDeadline(jobId);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.RevealNotOpen.selector, deadline, block.timestamp));
        bsm.revealCheckpoint(jobId, 0, keccak256("c0"), p, transcriptOf(ops[0]), saltOf(ops[0], keccak256("c0")));
        vm.warp(deadline + 1);
        vm.prank(ops[0]);
        bsm.revealCheckpoint(jobId, 0, keccak256("c0"), p, transcriptOf(ops[0]), saltOf(ops[0], keccak256("c0")));
    }

    function test_revert_RevealClosed() public {
        commit(ops[0], keccak256("c0"));
        uint256 closes = bsm.revealDeadline(jobId);
        vm.assertEq(closes, bsm.epochDeadline(jobId) + REVEAL_WINDOW);
        vm.warp(closes + 1);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.RevealClosed.selector, closes, closes + 1));
        bsm.revealCheckpoint(jobId, 0, keccak256("c0"), p, transcriptOf(ops[0]), saltOf(ops[0], keccak256("c0")));
    }

    function test_revert_NotCommitted() public {
        vm.warp(bsm.epochDeadline(jobId) + 1);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.NotCommitted.selector, jobId, 0, ops[0]));
        bsm.revealCheckpoint(jobId, 0, keccak256("c0"), p, transcriptOf(ops[0]), bytes32(0));
    }

    function test_revert_CommitmentMismatch() public {
        commit(ops[0], keccak256("c0"));
        vm.warp(bsm.epochDeadline(jobId) + 1);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.CommitmentMismatch.selector, jobId, ops[0]));
        bsm.revealCheckpoint(jobId, 0, keccak256("c1"), p, transcriptOf(ops[0]), saltOf(ops[0], keccak256("c0")));
    }

    function test_revert_AlreadyRevealed() public {
        commit(ops[0], keccak256("c0"));
        vm.warp(bsm.epochDeadline(jobId) + 1);
        vm.startPrank(ops[0]);
        bsm.revealCheckpoint(jobId, 0, keccak256("c0"), p, transcriptOf(ops[0]), saltOf(ops[0], keccak256("c0")));
        vm.expectRevert(abi.encodeWithSelector(I.AlreadyRevealed.selector, jobId, 0, ops[0]));
        bsm.revealCheckpoint(jobId, 0, keccak256("c0"), p, transcriptOf(ops[0]), saltOf(ops[0], keccak256("c0")));
        vm.stopPrank();
    }

    function test_revert_ParticipationLength() public {
        uint32[] memory short = new uint32[](2);
        bytes32 c = bsm.commitmentHash(jobId, 0, ops[0], keccak256("c0"), short, transcriptOf(ops[0]), 0);
        vm.prank(ops[0]);
        bsm.commitCheckpoint(jobId, 0, c);
        vm.warp(bsm.epochDeadline(jobId) + 1);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.ParticipationLength.selector, 2, 3));
        bsm.revealCheckpoint(jobId, 0, keccak256("c0"), short, transcriptOf(ops[0]), 0);
    }

    function test_revert_ParticipationTooHigh() public {
        p[1] = 11; // 40 steps / K=4 = 10 rounds
        commit(ops[0], keccak256("c0"));
        vm.warp(bsm.epochDeadline(jobId) + 1);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.ParticipationTooHigh.selector, 1, 11, 10));
        bsm.revealCheckpoint(jobId, 0, keccak256("c0"), p, transcriptOf(ops[0]), saltOf(ops[0], keccak256("c0")));
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
        // The outside finalizer: 10% of the protocol's 20%, out of the protocol's share.
        vm.assertEq(bsm.creditOf(reporter), 3 * PRICE * 20 / 100 / 10);
        vm.assertEq(bsm.creditOf(treasury), 3 * PRICE * 20 / 100 - 3 * PRICE * 20 / 100 / 10);
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
        reveal(job2);
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
        // The outside finalizer: 10% of the protocol's 20% of the 2 paid operator-epochs.
        uint256 bounty = 2 * PRICE * 20 / 100 * 1000 / 10000;
        vm.assertEq(bsm.creditOf(reporter), bounty);
        vm.assertEq(bsm.creditOf(caller), callerBefore, "the caller gains nothing from a slash");
        // Treasury: the slashes, whole, and its 20% of the 2 paid operator-epochs less the bounty.
        vm.assertEq(bsm.creditOf(treasury) - treasuryBefore, fab + sync + 2 * PRICE * 20 / 100 - bounty);
        // Slashed members leave at the boundary; the 2 honest ones are below minOperators (4),
        // so the job waits Open, unpaid, for joins.
        vm.assertEq(bsm.getMembers(job2).length, 2);
        vm.assertEq(uint8(status(job2)), uint8(I.JobStatus.Open));
        vm.assertFalse(bsm.getMembers(job2)[0] == m[2] || bsm.getMembers(job2)[1] == m[2]);
        assertConserved();
    }

    function test_dropoutSlashedAfterDeadline() public {
        uint32[] memory p = fullParticipation(jobId);
        p[2] = 0; // the silent member's packets are in no round
        submit(jobId, ops[0], keccak256("c0"), p);
        submit(jobId, ops[1], keccak256("c0"), p);
        uint256 deadline = block.timestamp + GRACE + EPOCH;
        vm.prank(reporter);
        vm.expectRevert(abi.encodeWithSelector(I.EpochNotFinalizable.selector, jobId, 0, 3, deadline + REVEAL_WINDOW));
        bsm.finalizeEpoch(jobId, 0);
        vm.warp(deadline + 1);
        reveal(jobId);
        vm.prank(reporter);
        vm.expectRevert(abi.encodeWithSelector(I.EpochNotFinalizable.selector, jobId, 2, 3, deadline + REVEAL_WINDOW));
        bsm.finalizeEpoch(jobId, 0);
        address silent = ops[2];
        uint256 before = bsm.getPool(silent).totalAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(silent).totalAssets, before - before * 500 / 10000);
        vm.assertEq(state(jobId).epoch, 1); // 2 of 3 is a quorum
        assertConserved();
    }

    /// Attack on an honest member: a slow host whose packets made every round but whose vote
    /// missed the commit deadline used to be slashed as a dropout. The quorum's participation
    /// proves it worked: it is not paid for the epoch and keeps its stake.
    function test_lateVoterInTheTranscript_unpaidNotSlashed() public {
        uint32[] memory p = fullParticipation(jobId);
        submit(jobId, ops[0], keccak256("c0"), p);
        submit(jobId, ops[1], keccak256("c0"), p);
        vm.warp(block.timestamp + GRACE + EPOCH + 1);
        reveal(jobId);
        address late = ops[2];
        uint256 before = bsm.getPool(late).totalAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(late).totalAssets, before, "its stake is whole");
        vm.assertEq(bsm.creditOf(late), 0, "and it is not paid");
        vm.assertEq(bsm.creditOf(ops[0]), PRICE * 40 / 100);
        assertConserved();
    }

    /// Attack on an honest member: a host slowed after joining sees it cannot finish the
    /// epoch, says so on chain (`leaveJob`) before the commit deadline and stops training, so
    /// its packets miss the last rounds and it never votes. It used to be slashed as a dropout;
    /// an announced leave is no silence: it is not paid for the epoch, keeps its stake and
    /// leaves at the boundary.
    function test_leaveAnnouncedBeforeTheDeadline_silent_unpaidNotSlashed() public {
        uint32[] memory p = fullParticipation(jobId);
        p[2] = p[2] / 2; // in the first half of the rounds only
        address slow = ops[2];
        vm.warp(block.timestamp + GRACE + EPOCH / 2);
        vm.prank(slow);
        bsm.leaveJob(jobId);
        submit(jobId, ops[0], keccak256("c0"), p);
        submit(jobId, ops[1], keccak256("c0"), p);
        vm.warp(block.timestamp + EPOCH / 2 + 1);
        reveal(jobId);
        uint256 before = bsm.getPool(slow).totalAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(slow).totalAssets, before, "its stake is whole");
        vm.assertEq(bsm.creditOf(slow), 0, "and it is not paid");
        vm.assertEq(bsm.creditOf(ops[0]), PRICE * 40 / 100);
        vm.assertEq(bsm.getMembers(jobId).length, 2, "it left at the boundary");
        assertConserved();
    }

    /// A member that stayed silent cannot excuse its absence once the deadline passed.
    function test_leaveAnnouncedAfterTheDeadline_silent_isADropout() public {
        uint32[] memory p = fullParticipation(jobId);
        p[2] = 0;
        submit(jobId, ops[0], keccak256("c0"), p);
        submit(jobId, ops[1], keccak256("c0"), p);
        vm.warp(block.timestamp + GRACE + EPOCH + 1);
        address silent = ops[2];
        vm.prank(silent);
        bsm.leaveJob(jobId);
        reveal(jobId);
        uint256 before = bsm.getPool(silent).totalAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(silent).totalAssets, before - before * 500 / 10000);
        assertConserved();
    }

    /// A leave is no veto: members whose announced leaves leave the others short of a quorum
    /// stopped an epoch they were seated for, and are dropouts.
    function test_leavesAnnouncedThatBlockTheQuorum_areDropouts() public {
        uint32[] memory p = fullParticipation(jobId);
        for (uint256 i = 1; i < 3; ++i) {
            vm.prank(ops[i]);
            bsm.leaveJob(jobId);
        }
        submit(jobId, ops[0], keccak256("c0"), p);
        vm.warp(block.timestamp + GRACE + EPOCH + 1);
        reveal(jobId);
        uint256 before = bsm.getPool(ops[1]).totalAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(ops[1]).totalAssets, before - before * 500 / 10000);
        vm.assertEq(bsm.getPool(ops[2]).totalAssets, before - before * 500 / 10000);
        vm.assertEq(bsm.creditOf(ops[0]), 0, "no quorum, nobody paid");
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
        reveal(jobId);
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
        prm.unworkableCompBps = 0;
        bsm = deployBSM(prm);
        address[] memory o = new address[](2);
        (o[0], o[1]) = (op(50), op(51));
        register(o[0], MIN_STAKE);
        register(o[1], MIN_STAKE);
        I.JobSpec memory s = spec(2, 2, 1);
        s.pricePerOperatorEpoch = price;
        vm.deal(caller, 2 * price);
        vm.prank(caller);
        uint256 id = bsm.createJob{value: 2 * price}(s);
        joinAll(id, o);
        submitAll(id, keccak256("x"));
        finalize(id);
        uint256 got = bsm.creditOf(o[0]) + bsm.creditOf(o[1]) + bsm.creditOf(treasury) + bsm.creditOf(developer)
            + bsm.creditOf(reporter) + bsm.getPool(o[0]).rewardReserve + bsm.getPool(o[1]).rewardReserve;
        vm.assertEq(got, 2 * price, "split != price");
        assertConserved();
    }

    function testFuzz_deadlineTiming(uint256 dt) public {
        dt = bound(dt, 0, 3 * EPOCH);
        vm.warp(block.timestamp + dt);
        if (dt <= GRACE + EPOCH + REVEAL_WINDOW) vm.expectRevert();
        bsm.finalizeEpoch(jobId, 0);
    }
}

