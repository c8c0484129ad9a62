// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IBSM} from "../utils/IBSM.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

/// The challenge game: a certified vote waits `challengeWindow` after its last reveal; an honest
/// member (or anyone registered, or the caller) bonds and disputes it; referees drawn by stake
/// among outside operators re-execute the epoch and commit-reveal the vote they get; the epoch
/// settles on their majority.
abstract contract ChallengeBase is BaseTest {
    uint64 internal constant WINDOW = 1 hours;

    address[] internal outsiders;

    function setUp() public virtual override {
        super.setUp();
        I.Params memory p = defaultParams();
        p.challengeWindow = WINDOW;
        bsm = deployBSM(p);
        for (uint256 i; i < 5; ++i) {
            outsiders.push(makeAddr(string.concat("referee", vm_toString(i))));
            register(outsiders[i], 2 * MIN_STAKE);
        }
    }

    /// A job of `sybils` fabricating members (1 ETH each) and `honest` members (`honestStake`
    /// each), everyone voting now and revealing at once; returns the members, sybils first.
    function certify(uint256 sybils, uint256 honest, uint256 honestStake, bytes32 sybilVote)
        internal
        returns (uint256 jobId, address[] memory ops)
    {
        uint256 n = sybils + honest;
        ops = new address[](n);
        for (uint256 i; i < n; ++i) {
            ops[i] = op(i + 1);
            register(ops[i], i < sybils ? MIN_STAKE : honestStake);
        }
        jobId = createJob(spec(uint8(n), uint8(n), 1));
        joinAll(jobId, ops);
        uint32[] memory p = fullParticipation(jobId);
        for (uint256 i; i < n; ++i) {
            submit(jobId, ops[i], i < sybils ? sybilVote : trained(), p);
        }
        reveal(jobId);
    }

    function trained() internal pure returns (bytes32) {
        return keccak256("the checkpoint the transcript leads to");
    }

    function challengeAs(address who, uint256 jobId) internal {
        vm.deal(who, who.balance + CHALLENGE_BOND);
        vm.prank(who);
        bsm.challenge{value: CHALLENGE_BOND}(jobId, 0, keccak256("transcript file"));
    }

    function applyAll(uint256 jobId, uint256 count) internal {
        for (uint256 i; i < count; ++i) {
            vm.prank(outsiders[i]);
            bsm.applyReferee(jobId, 0);
        }
    }

    /// Every drawn referee commits and reveals `verdict` (full participation).
    function judge(uint256 jobId, bytes32 verdict) internal returns (address[] memory refs) {
        return judgeWith(jobId, verdict, fullParticipation(jobId));
    }

    /// Every drawn referee commits and reveals (`verdict`, `p`), finding no voter consistent.
    function judgeWith(uint256 jobId, bytes32 verdict, uint32[] memory p) internal returns (address[] memory refs) {
        return judgeConsistent(jobId, verdict, p, 0);
    }

    /// Every drawn referee commits and reveals (`verdict`, `p`) and the voters whose own
    /// transcripts lead to their votes (`consistent`, bit i: member i).
    function judgeConsistent(uint256 jobId, bytes32 verdict, uint32[] memory p, uint256 consistent)
        internal
        returns (address[] memory refs)
    {
        I.ChallengeInfo memory c = bsm.challengeOf(state(jobId).attempt);
        vm.warp(c.openedAt + WINDOW);
        address[] memory applicants = c.applicants;
        // the first commit draws the referees: draw by committing as any drawn applicant
        for (uint256 i; i < applicants.length; ++i) {
            commitIfDrawn(jobId, applicants[i], verdict, p, consistent);
        }
        refs = bsm.challengeOf(state(jobId).attempt).referees;
        for (uint256 i; i < refs.length; ++i) {
            vm.prank(refs[i]);
            bsm.revealVerdict(jobId, 0, verdict, p, consistent, saltOf(refs[i], verdict));
        }
    }

    function commitIfDrawn(uint256 jobId, address a, bytes32 verdict, uint32[] memory p, uint256 consistent) internal {
        bytes32 c = bsm.commitmentHash(jobId, 0, a, verdict, p, bytes32(consistent), saltOf(a, verdict));
        vm.prank(a);
        try bsm.commitVerdict(jobId, 0, c) {} catch {}
    }

    /// Ether `a` holds in the BSM: credits, self-stake and rewards.
    function worth(address a) internal view returns (uint256) {
        return bsm.creditOf(a) + bsm.stakeOf(a, a) + bsm.pendingRewards(a, a);
    }

    function closesOf(uint256 jobId) internal view returns (uint256 closes) {
        (, closes) = bsm.certifiedVote(jobId);
    }

    function finalizeNow(uint256 jobId) internal {
        vm.prank(reporter);
        bsm.finalizeEpoch(jobId, 0);
    }
}

/// Attack: two sybil addresses with the minimum stake hold 2 of 3 seats and certify a
/// fabricated checkpoint. One honest member challenges, the referees re-execute, the sybils
/// are slashed, the honest member is paid, and the sybils' wei sum is negative.
contract SybilPairChallengeTest is ChallengeBase {
    function test_sybilPair_fabricationOverturnedByOneHonestMember() public {
        (uint256 jobId, address[] memory ops) = certify(2, 1, 100 ether, keccak256("fabricated"));
        address honest = ops[2];
        uint256[3] memory before = [worth(ops[0]), worth(ops[1]), worth(honest)];
        vm.expectRevert(); // certified is not final while the window is open
        finalizeNow(jobId);
        challengeAs(honest, jobId);
        applyAll(jobId, 3);
        judge(jobId, trained());
        vm.prank(reporter);
        bsm.resolveChallenge(jobId, 0);
        finalizeNow(jobId);

        vm.assertEq(bsm.epochCheckpoint(jobId, 0), trained(), "the verdict is the epoch's checkpoint");
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        vm.assertGe(worth(honest), before[2], "the honest member lost nothing");
        vm.assertEq(bsm.creditOf(honest), PRICE * 40 / 100 + CHALLENGE_BOND, "paid, and its bond back");
        for (uint256 i; i < 2; ++i) {
            vm.assertLt(worth(ops[i]), before[i], "each sybil ends with less than it put in");
            vm.assertEq(bsm.creditOf(ops[i]), 0, "no sybil is paid");
        }
        assertConserved();
    }

    /// The same coalition when nobody challenges: the honest member is slashed (the reason
    /// the window exists; every honest node challenges a certified vote it did not cast).
    function test_unchallenged_certifiedVoteSettles() public {
        (uint256 jobId, address[] memory ops) = certify(2, 1, 100 ether, keccak256("fabricated"));
        vm.warp(closesOf(jobId));
        uint256 pool = bsm.getPool(ops[2]).totalAssets;
        finalizeNow(jobId);
        vm.assertEq(bsm.getPool(ops[2]).totalAssets, pool - pool / 10);
        assertConserved();
    }
}

/// Attack: 5 of 7 seats (over 2/3) certify a fabricated checkpoint; either honest member's
/// challenge overturns it and every coalition member is slashed.
contract SevenSeatCoalitionChallengeTest is ChallengeBase {
    function test_twoThirdsOfSevenSeats_fabricationOverturned() public {
        (uint256 jobId, address[] memory ops) = certify(5, 2, 10 ether, keccak256("fabricated"));
        challengeAs(ops[6], jobId);
        applyAll(jobId, 5);
        judge(jobId, trained());
        bsm.resolveChallenge(jobId, 0);
        finalizeNow(jobId);
        vm.assertEq(bsm.epochCheckpoint(jobId, 0), trained());
        for (uint256 i; i < 5; ++i) {
            vm.assertLt(bsm.stakeOf(ops[i], ops[i]), MIN_STAKE, "coalition member slashed");
        }
        vm.assertEq(bsm.creditOf(ops[5]), PRICE * 40 / 100, "the honest member that did not challenge is paid");
        vm.assertEq(bsm.stakeOf(ops[5], ops[5]), 10 ether);
        assertConserved();
    }
}

/// Attack: the caller's sybils hold a quorum and vote UNWORKABLE after the honest member
/// trained, to get the escrow back. Challenged, the epoch settles on the trained checkpoint:
/// the honest member is paid, the sybils are slashed as dropouts and nobody is compensated.
contract CallerMajorityChallengeTest is ChallengeBase {
    function test_callerSybilsUnworkable_overturned() public {
        bytes32 unworkable = bsm.UNWORKABLE();
        (uint256 jobId, address[] memory ops) = certify(2, 1, MIN_STAKE, unworkable);
        uint256 callerBefore = bsm.creditOf(caller);
        challengeAs(ops[2], jobId);
        applyAll(jobId, 3);
        judge(jobId, trained());
        bsm.resolveChallenge(jobId, 0);
        finalizeNow(jobId);
        vm.assertEq(bsm.creditOf(ops[2]), PRICE * 40 / 100 + CHALLENGE_BOND);
        vm.assertEq(bsm.creditOf(ops[0]) + bsm.creditOf(ops[1]), 0, "no UNWORKABLE compensation");
        vm.assertEq(bsm.stakeOf(ops[0], ops[0]), MIN_STAKE - MIN_STAKE * 500 / 10000);
        // the caller gets back only the seats nobody earned
        vm.assertEq(bsm.creditOf(caller) - callerBefore, escrowOf(spec(3, 3, 1)) - PRICE);
        assertConserved();
    }
}

/// Attack: every seat is a sybil's; they vote UNWORKABLE in the block their epoch starts, to
/// collect the compensation without training. The window holds the vote; the caller disputes
/// it; the job's files build, so nothing proves UNWORKABLE and the referees re-execute the
/// transcript nobody showed: the start checkpoint, no participation. The sybils are dropouts,
/// nobody is compensated, the caller gets back the whole escrow and its bond.
contract UnprovenUnworkableTest is ChallengeBase {
    function test_unworkableInTheStartBlock_isADropoutOnceTheCallerDisputesIt() public {
        (uint256 jobId, address[] memory ops) = certify(3, 0, MIN_STAKE, bsm.UNWORKABLE());
        uint256 closes = closesOf(jobId);
        vm.expectRevert(abi.encodeWithSelector(I.ChallengeWindowOpen.selector, jobId, closes));
        finalizeNow(jobId);
        uint256 callerBefore = bsm.creditOf(caller);
        challengeAs(caller, jobId);
        applyAll(jobId, 3);
        judgeWith(jobId, state(jobId).checkpoint, new uint32[](3));
        bsm.resolveChallenge(jobId, 0);
        finalizeNow(jobId);
        for (uint256 i; i < ops.length; ++i) {
            vm.assertEq(bsm.creditOf(ops[i]), 0, "no compensation");
            vm.assertEq(bsm.stakeOf(ops[i], ops[i]), MIN_STAKE - MIN_STAKE * 500 / 10000, "a dropout");
        }
        vm.assertEq(bsm.creditOf(caller) - callerBefore, escrowOf(spec(3, 3, 1)) + CHALLENGE_BOND);
        assertConserved();
    }
}

/// A challenge of a correct certified vote loses its bond to the treasury and changes nothing
/// else; one nobody referees (or without a majority) gets its bond back and the vote stands.
contract WrongChallengeTest is ChallengeBase {
    function test_wrongChallenge_losesItsBond() public {
        (uint256 jobId, address[] memory ops) = certify(1, 2, MIN_STAKE, keccak256("fabricated"));
        uint256 treasuryBefore = bsm.creditOf(treasury);
        challengeAs(ops[0], jobId); // the outvoted fabricator disputes the honest quorum
        applyAll(jobId, 3);
        judge(jobId, trained());
        vm.expectEmit();
        emit I.ChallengeResolved(jobId, 0, keccak256(abi.encode(trained(), fullParticipation(jobId))), false);
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.creditOf(treasury) - treasuryBefore, CHALLENGE_BOND);
        finalizeNow(jobId);
        vm.assertEq(bsm.epochCheckpoint(jobId, 0), trained());
        vm.assertEq(bsm.creditOf(ops[0]), 0);
        assertConserved();
    }

    function test_unrefereedChallenge_bondBack_certifiedStands() public {
        (uint256 jobId, address[] memory ops) = certify(2, 1, MIN_STAKE, keccak256("fabricated"));
        challengeAs(ops[2], jobId);
        vm.warp(block.timestamp + 3 * WINDOW);
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.creditOf(ops[2]), CHALLENGE_BOND);
        finalizeNow(jobId);
        vm.assertEq(bsm.epochCheckpoint(jobId, 0), keccak256("fabricated"));
        assertConserved();
    }
}

/// Referees: drawn by stake among outside applicants, bonded while the challenge is open,
/// slashed off the majority (fabrication rate) or silent (dropout rate).
contract RefereeTest is ChallengeBase {
    uint256 internal jobId;
    address[] internal ops;

    function setUp() public override {
        super.setUp();
        (jobId, ops) = certify(2, 1, MIN_STAKE, keccak256("fabricated"));
        challengeAs(ops[2], jobId);
    }

    function test_refereesOffTheMajority_slashed() public {
        applyAll(jobId, 3);
        vm.warp(block.timestamp + WINDOW);
        uint32[] memory p = fullParticipation(jobId);
        bytes32[3] memory verdicts = [trained(), trained(), keccak256("fabricated")];
        for (uint256 i; i < 3; ++i) {
            bytes32 c = bsm.commitmentHash(jobId, 0, outsiders[i], verdicts[i], p, bytes32(0), bytes32(i));
            vm.prank(outsiders[i]);
            bsm.commitVerdict(jobId, 0, c);
        }
        for (uint256 i; i < 3; ++i) {
            vm.prank(outsiders[i]);
            bsm.revealVerdict(jobId, 0, verdicts[i], p, 0, bytes32(i));
        }
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.stakeOf(outsiders[0], outsiders[0]), 2 * MIN_STAKE);
        vm.assertEq(bsm.stakeOf(outsiders[2], outsiders[2]), 2 * MIN_STAKE * 9 / 10, "wrong verdict");
        for (uint256 i; i < 3; ++i) {
            vm.assertEq(bsm.bondedOf(outsiders[i]), 0, "bond released");
        }
        assertConserved();
    }

    function test_silentReferee_slashedAsDropout_withheldAtFabricationRate() public {
        applyAll(jobId, 3);
        vm.warp(block.timestamp + WINDOW);
        uint32[] memory p = fullParticipation(jobId);
        for (uint256 i; i < 2; ++i) {
            bytes32 c = bsm.commitmentHash(jobId, 0, outsiders[i], trained(), p, bytes32(0), bytes32(i));
            vm.prank(outsiders[i]);
            bsm.commitVerdict(jobId, 0, c);
        }
        vm.warp(block.timestamp + WINDOW);
        vm.prank(outsiders[0]);
        bsm.revealVerdict(jobId, 0, trained(), p, 0, bytes32(0));
        vm.warp(block.timestamp + WINDOW);
        bsm.resolveChallenge(jobId, 0);
        // 1 of 3 revealed: no majority, so no verdict; outsiders[1] withheld, outsiders[2] silent
        vm.assertEq(bsm.stakeOf(outsiders[1], outsiders[1]), 2 * MIN_STAKE * 9 / 10);
        vm.assertEq(bsm.stakeOf(outsiders[2], outsiders[2]), 2 * MIN_STAKE * 95 / 100);
        vm.assertEq(bsm.creditOf(ops[2]), CHALLENGE_BOND, "no verdict: the bond goes back");
        assertConserved();
    }

    function test_draw_takesRefereeCountAndReleasesTheRest() public {
        applyAll(jobId, 5);
        for (uint256 i; i < 5; ++i) {
            vm.assertEq(bsm.bondedOf(outsiders[i]), CHALLENGE_BOND);
        }
        vm.warp(block.timestamp + WINDOW);
        for (uint256 i; i < 5; ++i) {
            commitIfDrawn(jobId, outsiders[i], trained(), fullParticipation(jobId), 0);
        }
        address[] memory refs = bsm.challengeOf(state(jobId).attempt).referees;
        vm.assertEq(refs.length, 3);
        uint256 released;
        for (uint256 i; i < 5; ++i) {
            if (bsm.bondedOf(outsiders[i]) == 0) ++released;
        }
        vm.assertEq(released, 2, "the two applicants not drawn are unbonded");
    }

    function testFuzz_draw_distinctApplicants(uint256 randao, uint8 applicants) public {
        applicants = uint8(bound(applicants, 1, 5));
        applyAll(jobId, applicants);
        vm.warp(block.timestamp + WINDOW);
        vm.prevrandao(bytes32(randao));
        for (uint256 i; i < applicants; ++i) {
            commitIfDrawn(jobId, outsiders[i], trained(), fullParticipation(jobId), 0);
        }
        address[] memory refs = bsm.challengeOf(state(jobId).attempt).referees;
        vm.assertEq(refs.length, applicants < 3 ? applicants : 3);
        for (uint256 i; i < refs.length; ++i) {
            for (uint256 k; k < i; ++k) {
                vm.assertNotEq(refs[i], refs[k]);
            }
        }
    }

    function test_revert_NotAnOutsider_memberOrChallenger() public {
        vm.expectRevert(abi.encodeWithSelector(I.NotAnOutsider.selector, jobId, ops[0]));
        vm.prank(ops[0]);
        bsm.applyReferee(jobId, 0);
        applyAll(jobId, 1);
        vm.expectRevert(abi.encodeWithSelector(I.NotAnOutsider.selector, jobId, outsiders[0]));
        vm.prank(outsiders[0]);
        bsm.applyReferee(jobId, 0);
    }

    function test_revert_InsufficientFreeStake_bondedStakeCannotReferee() public {
        address thin = makeAddr("thin referee");
        register(thin, MIN_STAKE + 0.4 ether);
        uint256 other = createJob(spec(2, 3, 1));
        vm.prank(thin);
        bsm.joinJob(other); // bonds SEAT_BOND of its stake
        uint256 needed = SEAT_BOND + CHALLENGE_BOND;
        vm.expectRevert(abi.encodeWithSelector(I.InsufficientFreeStake.selector, MIN_STAKE + 0.4 ether, needed));
        vm.prank(thin);
        bsm.applyReferee(jobId, 0);
    }

    function test_revert_NotInPhase_lateApplication() public {
        uint256 opened = block.timestamp;
        vm.warp(opened + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(I.NotInPhase.selector, opened, opened + WINDOW, opened + WINDOW));
        vm.prank(outsiders[0]);
        bsm.applyReferee(jobId, 0);
    }

    function test_revert_NotAReferee_undrawn() public {
        applyAll(jobId, 1);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(I.NotAReferee.selector, jobId, outsiders[1]));
        vm.prank(outsiders[1]);
        bsm.commitVerdict(jobId, 0, keccak256("c"));
    }

    function test_revert_ChallengeUnresolved() public {
        vm.expectRevert(abi.encodeWithSelector(I.ChallengeUnresolved.selector, jobId, 0));
        finalizeNow(jobId);
    }

    function test_revert_AlreadyChallenged() public {
        vm.expectRevert(abi.encodeWithSelector(I.AlreadyChallenged.selector, jobId, 0, ops[2]));
        challengeAs(ops[1], jobId);
    }

    function test_postTranscript_byAVoterInTheApplyPhase() public {
        vm.expectEmit();
        emit I.TranscriptPosted(jobId, 0, ops[0], keccak256("its file"));
        vm.prank(ops[0]);
        bsm.postTranscript(jobId, 0, keccak256("its file"));
    }

    function test_revert_postTranscript_NotMember() public {
        vm.expectRevert(abi.encodeWithSelector(I.NotMember.selector, jobId, outsiders[0]));
        vm.prank(outsiders[0]);
        bsm.postTranscript(jobId, 0, keccak256("a file"));
    }

    function test_revert_postTranscript_NotInPhase() public {
        uint256 opened = block.timestamp;
        vm.warp(opened + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(I.NotInPhase.selector, opened, opened + WINDOW, opened + WINDOW));
        vm.prank(ops[0]);
        bsm.postTranscript(jobId, 0, keccak256("a file"));
    }

    function test_revert_ChallengeResolvedAlready() public {
        vm.warp(block.timestamp + 3 * WINDOW);
        bsm.resolveChallenge(jobId, 0);
        vm.expectRevert(abi.encodeWithSelector(I.ChallengeResolvedAlready.selector, jobId, 0));
        bsm.resolveChallenge(jobId, 0);
    }
}

/// Who may challenge what, and when.
contract ChallengeTest is ChallengeBase {
    function test_revert_ChallengeWindowOpen() public {
        (uint256 jobId,) = certify(1, 2, MIN_STAKE, trained());
        (bytes32 key, uint256 closes) = bsm.certifiedVote(jobId);
        vm.assertEq(key, keccak256(abi.encode(trained(), fullParticipation(jobId))));
        vm.assertEq(closes, block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(I.ChallengeWindowOpen.selector, jobId, closes));
        finalizeNow(jobId);
        vm.warp(closes);
        finalizeNow(jobId);
    }

    function test_revert_ChallengeWindowClosed() public {
        (uint256 jobId, address[] memory ops) = certify(2, 1, MIN_STAKE, keccak256("fabricated"));
        uint256 closes = closesOf(jobId);
        vm.warp(closes);
        vm.expectRevert(abi.encodeWithSelector(I.ChallengeWindowClosed.selector, closes, closes));
        challengeAs(ops[2], jobId);
    }

    function test_revert_NothingToChallenge_beforeTheReveals() public {
        address[] memory ops = registerN(3);
        uint256 jobId = createJob(spec(3, 3, 1));
        joinAll(jobId, ops);
        vm.expectRevert(abi.encodeWithSelector(I.NothingToChallenge.selector, jobId, 0));
        challengeAs(ops[0], jobId);
    }

    function test_revert_NotAChallenger() public {
        (uint256 jobId,) = certify(2, 1, MIN_STAKE, keccak256("fabricated"));
        address stranger = makeAddr("stranger");
        vm.expectRevert(abi.encodeWithSelector(I.NotAChallenger.selector, stranger));
        challengeAs(stranger, jobId);
        challengeAs(caller, jobId); // the job's caller may
    }

    function test_revert_WrongChallengeBond() public {
        (uint256 jobId, address[] memory ops) = certify(2, 1, MIN_STAKE, keccak256("fabricated"));
        vm.deal(ops[2], 1 ether);
        vm.expectRevert(abi.encodeWithSelector(I.WrongChallengeBond.selector, CHALLENGE_BOND, 1));
        vm.prank(ops[2]);
        bsm.challenge{value: 1}(jobId, 0, bytes32(0));
    }

    function test_revert_InvalidChallengeParams() public {
        I.Params memory p = defaultParams();
        p.challengeWindow = WINDOW;
        p.refereeCount = 2;
        vm.expectRevert(abi.encodeWithSelector(I.InvalidChallengeParams.selector, 2, CHALLENGE_BOND));
        deployBSM(p);
    }

    /// Without a window a certified vote is final at once, and nobody can challenge it.
    function test_noWindow_noChallenge() public {
        bsm = deployBSM(defaultParams());
        (uint256 jobId, address[] memory ops) = certify(2, 1, MIN_STAKE, keccak256("fabricated"));
        vm.expectRevert(abi.encodeWithSelector(I.ChallengeWindowClosed.selector, block.timestamp, block.timestamp));
        challengeAs(ops[2], jobId);
        finalizeNow(jobId);
    }

    function testFuzz_challengeWindowFitsTheUnbondingPeriod(uint64 window) public {
        I.Params memory p = defaultParams();
        p.challengeWindow = uint64(bound(window, 1, UNBONDING));
        uint256 span = uint256(GRACE) + MIN_EPOCH + REVEAL_WINDOW + 4 * uint256(p.challengeWindow);
        if (UNBONDING / 4 < span) {
            vm.expectRevert(abi.encodeWithSelector(I.UnbondingTooShort.selector, UNBONDING, 4 * span));
            deployBSM(p);
        } else {
            IBSM b = deployBSM(p);
            vm.assertEq(b.maxEpochDuration(), UNBONDING / 4 - GRACE - REVEAL_WINDOW - 4 * uint256(p.challengeWindow));
        }
    }
}

/// The caller cancels a running job while its epoch's certified vote is challenged: the
/// epoch still settles on the referees' verdict (the honest member paid, the fabricators
/// slashed), then the job closes `Cancelled` with the unearned epoch refunded.
contract CancelDuringChallengeTest is ChallengeBase {
    function test_cancelDuringChallenge_settlesOnTheVerdict() public {
        address[] memory ops = new address[](3);
        for (uint256 i; i < 3; ++i) {
            ops[i] = op(i + 1);
            register(ops[i], i < 2 ? MIN_STAKE : 100 ether);
        }
        uint256 jobId = createJob(spec(3, 3, 2));
        joinAll(jobId, ops);
        uint32[] memory p = fullParticipation(jobId);
        for (uint256 i; i < 3; ++i) {
            submit(jobId, ops[i], i < 2 ? keccak256("fabricated") : trained(), p);
        }
        reveal(jobId);
        challengeAs(ops[2], jobId);
        vm.prank(caller);
        bsm.cancelJob(jobId);
        vm.expectRevert(abi.encodeWithSelector(I.ChallengeUnresolved.selector, jobId, 0));
        finalizeNow(jobId);
        applyAll(jobId, 3);
        judge(jobId, trained());
        vm.prank(reporter);
        bsm.resolveChallenge(jobId, 0);
        finalizeNow(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Cancelled));
        vm.assertEq(bsm.epochCheckpoint(jobId, 0), trained());
        vm.assertEq(bsm.creditOf(ops[2]), PRICE * 40 / 100 + CHALLENGE_BOND, "paid, and its bond back");
        vm.assertEq(bsm.creditOf(ops[0]), 0, "a fabricator is not paid");
        vm.assertEq(bsm.creditOf(caller), PRICE * 3 * 2 - PRICE, "all but the one paid operator-epoch");
        assertConserved();
    }
}

/// Attack: a 2/3 coalition votes the checkpoint its own transcript file leads to, a file that
/// leaves out the honest member's packets (or holds packets the honest member never got in
/// time). Which packets reached whom in time cannot be proven after the epoch, so the referees
/// uphold the coalition's vote, and before per-voter judgement the honest dissenter, whose own
/// file leads to its own vote, was slashed as a fabricator and lost its challenge bond.
contract ConsistentDissenterTest is ChallengeBase {
    function upheldCoalition(uint256 consistent) internal returns (uint256 jobId, address[] memory ops) {
        (jobId, ops) = certify(2, 1, 100 ether, keccak256("the coalition's own transcript"));
        challengeAs(ops[2], jobId);
        applyAll(jobId, 3);
        judgeConsistent(jobId, keccak256("the coalition's own transcript"), fullParticipation(jobId), consistent);
        vm.prank(reporter);
        bsm.resolveChallenge(jobId, 0);
    }

    function test_consistentDissenter_paidAndBondBack_whateverTheVerdict() public {
        (uint256 jobId, address[] memory ops) = upheldCoalition(7);
        address honest = ops[2];
        uint256 before = worth(honest);
        finalizeNow(jobId);

        vm.assertEq(bsm.epochCheckpoint(jobId, 0), keccak256("the coalition's own transcript"));
        vm.assertEq(bsm.creditOf(honest), PRICE * 40 / 100 + CHALLENGE_BOND, "paid, and its bond back");
        vm.assertGe(worth(honest), before + PRICE * 40 / 100, "paid, not slashed");
        for (uint256 i; i < 2; ++i) {
            vm.assertEq(bsm.creditOf(ops[i]), PRICE * 40 / 100, "a consistent majority is paid");
            vm.assertEq(bsm.stakeOf(ops[i], ops[i]), MIN_STAKE, "and not slashed");
        }
        assertConserved();
    }

    /// A dissenter whose own file does not lead to its vote is a fabricator: slashed, and its
    /// challenge upheld costs its bond.
    function test_inconsistentDissenter_slashedAndLosesItsBond() public {
        (uint256 jobId, address[] memory ops) = upheldCoalition(3);
        address honest = ops[2];
        uint256 before = worth(honest);
        finalizeNow(jobId);
        vm.assertEq(worth(honest), before - before / 10, "slashed at the fabrication rate");
        vm.assertEq(bsm.creditOf(honest), 0, "neither paid nor its bond back");
        assertConserved();
    }

    /// A voter of the verdict is consistent too, but disputing its own vote is no dissent: an
    /// upheld challenge costs it the bond (else any member could delay every payout for free).
    function test_consistentVoterOfTheVerdict_challengingLosesItsBond() public {
        (uint256 jobId, address[] memory ops) = certify(0, 3, MIN_STAKE, trained());
        challengeAs(ops[0], jobId);
        applyAll(jobId, 3);
        judgeConsistent(jobId, trained(), fullParticipation(jobId), 7);
        uint256 treasury0 = bsm.creditOf(treasury);
        vm.prank(reporter);
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.creditOf(treasury), treasury0 + CHALLENGE_BOND, "the bond to the treasury");
        vm.assertEq(bsm.creditOf(ops[0]), 0, "no bond back");
        assertConserved();
    }

    /// The referees must agree on whom they found consistent, not only on the vote: the one
    /// off the majority's bitmap is slashed like one off its vote.
    function test_refereeOffTheMajoritysBitmap_slashed() public {
        (uint256 jobId, address[] memory ops) = certify(2, 1, 100 ether, keccak256("x"));
        challengeAs(ops[2], jobId);
        applyAll(jobId, 3);
        uint32[] memory p = fullParticipation(jobId);
        uint256[3] memory bits = [uint256(7), 7, 3];
        vm.warp(bsm.challengeOf(state(jobId).attempt).openedAt + WINDOW);
        for (uint256 i; i < 3; ++i) {
            commitIfDrawn(jobId, outsiders[i], keccak256("x"), p, bits[i]);
        }
        vm.assertEq(bsm.challengeOf(state(jobId).attempt).referees.length, 3, "all three drawn");
        for (uint256 i; i < 3; ++i) {
            vm.prank(outsiders[i]);
            bsm.revealVerdict(jobId, 0, keccak256("x"), p, bits[i], saltOf(outsiders[i], keccak256("x")));
        }
        vm.prank(reporter);
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.challengeOf(state(jobId).attempt).consistent, 7, "the majority's bitmap");
        vm.assertLt(worth(outsiders[2]), 2 * MIN_STAKE, "the referee off the bitmap is slashed");
        vm.assertEq(worth(outsiders[0]), 2 * MIN_STAKE, "the majority is not");
        assertConserved();
    }
}

/// Attack: a free-rider takes a seat, skips the compute and re-sends a stale packet every round;
/// the packets are valid and near honest scale, the transcript holds them and its vote is the
/// quorum's, so without replay it was paid in full. A member that replayed one of its rounds
/// from the private state it committed to (and got another packet) challenges with the claim;
/// the referees replay the same round and find it caught: slashed, unpaid, the challenger's
/// bond back, the certified checkpoint unchanged.
contract FailedReplayTest is ChallengeBase {
    function test_freeRider_caughtByReplay_slashedAndUnpaid() public {
        (uint256 jobId, address[] memory ops) = certify(0, 4, MIN_STAKE, trained());
        address rider = ops[3];
        uint256 before = worth(rider);
        challengeAs(ops[0], jobId);
        applyAll(jobId, 3);
        uint256 everyoneConsistent = 15;
        judgeConsistent(jobId, trained(), fullParticipation(jobId), everyoneConsistent | (1 << (128 + 3)));
        vm.prank(reporter);
        bsm.resolveChallenge(jobId, 0);
        I.ChallengeInfo memory c = bsm.challengeOf(state(jobId).attempt);
        vm.assertEq(c.caught, 1 << 3);
        vm.assertEq(c.consistent, everyoneConsistent);
        vm.expectEmit();
        emit I.Slashed(rider, jobId, 0, I.SlashReason.FailedReplay, MIN_STAKE / 10, reporter);
        finalizeNow(jobId);

        vm.assertEq(bsm.epochCheckpoint(jobId, 0), trained(), "the checkpoint stands");
        vm.assertEq(bsm.creditOf(rider), 0, "the free-rider is not paid");
        vm.assertEq(worth(rider), before - MIN_STAKE / 10, "and loses the fabrication rate");
        vm.assertEq(bsm.creditOf(ops[0]), PRICE * 40 / 100 + CHALLENGE_BOND, "the checker: paid, bond back");
        for (uint256 i = 1; i < 3; ++i) {
            vm.assertEq(bsm.creditOf(ops[i]), PRICE * 40 / 100, "the honest members are paid");
        }
        assertConserved();
    }

    /// Without a challenge the free-rider votes the quorum's checkpoint and is paid like anyone:
    /// the reason a failed replay must reach the chain.
    function test_unchallenged_freeRiderPaid() public {
        (uint256 jobId, address[] memory ops) = certify(0, 4, MIN_STAKE, trained());
        vm.warp(closesOf(jobId));
        finalizeNow(jobId);
        vm.assertEq(bsm.creditOf(ops[3]), PRICE * 40 / 100);
    }
}
