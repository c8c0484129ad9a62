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

    /// Mines the block whose hash seeds the draw and draws the referees.
    function drawReferees(uint256 jobId) internal returns (address[] memory refs) {
        vm.roll(block.number + 2);
        bsm.drawReferees(jobId, 0);
        refs = bsm.challengeOf(state(jobId).attempt).referees;
    }

    /// What an excused challenger gets back of its bond once the referees reached a verdict:
    /// the verdict's referees are paid the other half.
    function bondBack() internal pure returns (uint256) {
        return CHALLENGE_BOND - CHALLENGE_BOND / 2 / 3 * 3; // three referees share it
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
        refs = c.seedBlock == 0 ? c.referees : drawReferees(jobId);
        for (uint256 i; i < refs.length; ++i) {
            commitIfDrawn(jobId, refs[i], verdict, p, consistent);
        }
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
        drawReferees(jobId);
        judge(jobId, trained());
        vm.prank(reporter);
        bsm.resolveChallenge(jobId, 0);
        finalizeNow(jobId);

        vm.assertEq(bsm.epochCheckpoint(jobId, 0), trained(), "the verdict is the epoch's checkpoint");
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        vm.assertGe(worth(honest), before[2], "the honest member lost nothing");
        vm.assertEq(bsm.creditOf(honest), PRICE * 40 / 100 + bondBack(), "paid, and its bond back");
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
        drawReferees(jobId);
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
        drawReferees(jobId);
        judge(jobId, trained());
        bsm.resolveChallenge(jobId, 0);
        finalizeNow(jobId);
        vm.assertEq(bsm.creditOf(ops[2]), PRICE * 40 / 100 + bondBack());
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
        drawReferees(jobId);
        judgeWith(jobId, state(jobId).checkpoint, new uint32[](3));
        bsm.resolveChallenge(jobId, 0);
        finalizeNow(jobId);
        for (uint256 i; i < ops.length; ++i) {
            vm.assertEq(bsm.creditOf(ops[i]), 0, "no compensation");
            vm.assertEq(bsm.stakeOf(ops[i], ops[i]), MIN_STAKE - MIN_STAKE * 500 / 10000, "a dropout");
        }
        vm.assertEq(bsm.creditOf(caller) - callerBefore, escrowOf(spec(3, 3, 1)) + bondBack());
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
        drawReferees(jobId);
        judge(jobId, trained());
        vm.expectEmit();
        emit I.ChallengeResolved(jobId, 0, keccak256(abi.encode(trained(), fullParticipation(jobId))), false);
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.creditOf(treasury) - treasuryBefore, bondBack(), "the bond less the referees' pay");
        finalizeNow(jobId);
        vm.assertEq(bsm.epochCheckpoint(jobId, 0), trained());
        vm.assertEq(bsm.creditOf(ops[0]), 0);
        assertConserved();
    }

    /// A dispute nobody could judge changed nothing and held every member's pay for three
    /// windows: it is not free (a quarter of the bond to the treasury), or a member could
    /// delay every epoch's pay at no cost.
    function test_unrefereedChallenge_costsAQuarterOfTheBond_certifiedStands() public {
        (uint256 jobId, address[] memory ops) = certify(2, 1, MIN_STAKE, keccak256("fabricated"));
        challengeAs(ops[2], jobId);
        vm.warp(block.timestamp + 3 * WINDOW);
        uint256 treasury0 = bsm.creditOf(treasury);
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.creditOf(ops[2]), CHALLENGE_BOND * 3 / 4);
        vm.assertEq(bsm.creditOf(treasury) - treasury0, CHALLENGE_BOND / 4);
        finalizeNow(jobId);
        vm.assertEq(bsm.epochCheckpoint(jobId, 0), keccak256("fabricated"));
        assertConserved();
    }
}

/// Referees: drawn by capped self-stake among every registered outsider, from the hash of the
/// block after the challenge's, with weights as they stood at the challenge: nobody applies,
/// so nobody crowds the jury, and no stake moved once the seed is known re-rolls it.
contract RefereeTest is ChallengeBase {
    uint256 internal jobId;
    address[] internal ops;

    function setUp() public override {
        super.setUp();
        (jobId, ops) = certify(2, 1, MIN_STAKE, keccak256("fabricated"));
        challengeAs(ops[2], jobId);
    }

    function commitAs(address r, bytes32 verdict, uint256 salt) internal {
        bytes32 c = bsm.commitmentHash(jobId, 0, r, verdict, fullParticipation(jobId), bytes32(0), bytes32(salt));
        vm.prank(r);
        bsm.commitVerdict(jobId, 0, c);
    }

    function revealAs(address r, bytes32 verdict, uint256 salt) internal {
        uint32[] memory p = fullParticipation(jobId);
        vm.prank(r);
        bsm.revealVerdict(jobId, 0, verdict, p, 0, bytes32(salt));
    }

    function test_refereesOffTheMajority_slashed_theMajorityPaid() public {
        address[] memory refs = drawReferees(jobId);
        vm.warp(block.timestamp + WINDOW);
        bytes32[3] memory verdicts = [trained(), trained(), keccak256("fabricated")];
        for (uint256 i; i < 3; ++i) {
            commitAs(refs[i], verdicts[i], i);
        }
        for (uint256 i; i < 3; ++i) {
            revealAs(refs[i], verdicts[i], i);
        }
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.stakeOf(refs[0], refs[0]), 2 * MIN_STAKE);
        vm.assertEq(bsm.creditOf(refs[0]), CHALLENGE_BOND / 4, "half the bond, shared by the verdict's two");
        vm.assertEq(bsm.creditOf(refs[1]), CHALLENGE_BOND / 4);
        vm.assertEq(bsm.stakeOf(refs[2], refs[2]), 2 * MIN_STAKE * 9 / 10, "wrong verdict");
        vm.assertEq(bsm.creditOf(refs[2]), 0);
        assertConserved();
    }

    function test_withheldVerdict_slashedAtFabricationRate_silentOnesNotWithoutAVerdict() public {
        address[] memory refs = drawReferees(jobId);
        vm.warp(block.timestamp + WINDOW);
        for (uint256 i; i < 2; ++i) {
            commitAs(refs[i], trained(), i);
        }
        vm.warp(block.timestamp + WINDOW);
        revealAs(refs[0], trained(), 0);
        vm.warp(block.timestamp + WINDOW);
        bsm.resolveChallenge(jobId, 0);
        // 1 of 3 revealed: no verdict; refs[1] withheld a verdict it committed to, refs[2]
        // never committed (the files it needed may never have been served)
        vm.assertEq(bsm.stakeOf(refs[1], refs[1]), 2 * MIN_STAKE * 9 / 10);
        vm.assertEq(bsm.stakeOf(refs[2], refs[2]), 2 * MIN_STAKE, "absence is not guilt");
        // a dispute that changed nothing delayed everyone's pay: a quarter of the bond
        vm.assertEq(bsm.creditOf(ops[2]), CHALLENGE_BOND * 3 / 4, "no verdict: three quarters back");
        assertConserved();
    }

    function test_silentReferee_slashedAsDropout_whenTheOthersDelivered() public {
        address[] memory refs = drawReferees(jobId);
        vm.warp(block.timestamp + WINDOW);
        for (uint256 i; i < 2; ++i) {
            commitAs(refs[i], trained(), i);
        }
        vm.warp(block.timestamp + WINDOW);
        for (uint256 i; i < 2; ++i) {
            revealAs(refs[i], trained(), i);
        }
        vm.warp(block.timestamp + WINDOW);
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.stakeOf(refs[2], refs[2]), 2 * MIN_STAKE * 95 / 100);
        vm.assertEq(bsm.creditOf(refs[0]) + bsm.creditOf(refs[1]), CHALLENGE_BOND / 2);
        assertConserved();
    }

    /// Attack: the caller withholds the job's files, so no drawn referee can judge. Nobody
    /// commits: nobody is slashed, and the certified vote stands.
    function test_noRefereeCommits_nobodySlashed() public {
        address[] memory refs = drawReferees(jobId);
        vm.warp(block.timestamp + 3 * WINDOW);
        bsm.resolveChallenge(jobId, 0);
        for (uint256 i; i < refs.length; ++i) {
            vm.assertEq(bsm.stakeOf(refs[i], refs[i]), 2 * MIN_STAKE);
        }
        vm.assertEq(bsm.creditOf(ops[2]), CHALLENGE_BOND * 3 / 4, "no verdict: a quarter of the bond");
        assertConserved();
    }

    function test_draw_refereeCountOutsiders() public {
        address[] memory refs = drawReferees(jobId);
        vm.assertEq(refs.length, 3);
        for (uint256 i; i < refs.length; ++i) {
            vm.assertEq(bsm.challengeOf(state(jobId).attempt).seedBlock, 0, "drawn once");
            bool outsider;
            for (uint256 k; k < outsiders.length; ++k) {
                outsider = outsider || refs[i] == outsiders[k];
            }
            vm.assertTrue(outsider, "only registered operators outside the job");
        }
    }

    /// Attack: the job's caller, its members and the challenger are registered operators and
    /// would judge their own dispute. Whatever the seed, none of them is drawn.
    /// A fresh BSM with the five outsiders registered again.
    function redeploy() internal {
        I.Params memory p = defaultParams();
        p.challengeWindow = WINDOW;
        bsm = deployBSM(p);
        for (uint256 i; i < outsiders.length; ++i) {
            register(outsiders[i], 2 * MIN_STAKE);
        }
    }

    function testFuzz_draw_neverAnInsider(bytes32 seed) public {
        vm.assume(seed != bytes32(0)); // a zero hash is a block out of reach: renewed
        redeploy();
        register(caller, 10 * MIN_STAKE);
        (uint256 other, address[] memory members) = certify(2, 1, 10 * MIN_STAKE, keccak256("fabricated"));
        challengeAs(members[0], other);
        vm.roll(block.number + 2);
        vm.setBlockhash(block.number - 1, seed);
        bsm.drawReferees(other, 0);
        address[] memory refs = bsm.challengeOf(state(other).attempt).referees;
        vm.assertGt(refs.length, 0);
        for (uint256 i; i < refs.length; ++i) {
            vm.assertNotEq(refs[i], caller);
            for (uint256 k; k < members.length; ++k) {
                vm.assertNotEq(refs[i], members[k]);
            }
            for (uint256 k; k < i; ++k) {
                vm.assertNotEq(refs[i], refs[k]);
            }
        }
    }

    /// Attack (grinding): once the seed block is mined, the outsiders see which of them the
    /// seed would draw at which weight; they stake up to the cap, unstake and register fresh
    /// operators to change who is drawn. The draw reads the registry and the weights as they
    /// stood at the challenge: the same jury.
    function test_draw_cannotBeRerolledOnceTheSeedIsKnown() public {
        redeploy();
        address heavy = makeAddr("heavy outsider");
        register(heavy, 10 * MIN_STAKE); // the others are accepted at 2/10 per pick
        (uint256 other,) = certify(2, 1, MIN_STAKE, keccak256("fabricated"));
        challengeAs(op(3), other);
        vm.roll(block.number + 2);
        uint256 snap = vm.snapshotState();
        bsm.drawReferees(other, 0);
        address[] memory expected = bsm.challengeOf(state(other).attempt).referees;
        vm.revertToState(snap);
        for (uint256 i; i < outsiders.length; ++i) {
            vm.deal(outsiders[i], 8 * MIN_STAKE);
            vm.prank(outsiders[i]);
            bsm.stake{value: 8 * MIN_STAKE}(); // every pick of them now accepted
        }
        vm.prank(heavy);
        bsm.unstake(9 * MIN_STAKE);
        for (uint256 i; i < 8; ++i) {
            register(makeAddr(string.concat("late", vm_toString(i))), 10 * MIN_STAKE);
        }
        bsm.drawReferees(other, 0);
        address[] memory refs = bsm.challengeOf(state(other).attempt).referees;
        vm.assertEq(refs.length, expected.length);
        for (uint256 i; i < refs.length; ++i) {
            vm.assertEq(refs[i], expected[i], "the same referees");
        }
    }

    /// Attack (crowding): 20 sybils at the minimum stake against 5 honest outsiders at the
    /// weight cap. Nobody applies, so the sybils cannot fill the jury; over 40 seeds they hold
    /// a majority of it about as often as their share of the outside weight says (2/7 of it:
    /// 21% expected), never every time.
    function test_crowding_sybilsGetTheirShareOfJuries_notAllOfThem() public {
        redeploy();
        for (uint256 i; i < outsiders.length; ++i) {
            vm.deal(outsiders[i], 8 * MIN_STAKE);
            vm.prank(outsiders[i]);
            bsm.stake{value: 8 * MIN_STAKE}();
        }
        address[] memory sybils = new address[](20);
        for (uint256 i; i < sybils.length; ++i) {
            sybils[i] = makeAddr(string.concat("sybil", vm_toString(i)));
            register(sybils[i], MIN_STAKE);
        }
        (uint256 other,) = certify(1, 2, MIN_STAKE, keccak256("fabricated"));
        challengeAs(sybils[0], other);
        uint256 captured;
        for (uint256 s; s < 40; ++s) {
            uint256 snap = vm.snapshotState();
            address[] memory refs = drawSeeded(other, keccak256(abi.encode("seed", s)));
            vm.assertEq(refs.length, 3);
            uint256 theirs;
            for (uint256 i; i < refs.length; ++i) {
                vm.assertNotEq(refs[i], sybils[0], "never the challenger");
                for (uint256 k; k < sybils.length; ++k) {
                    if (refs[i] == sybils[k]) ++theirs;
                }
            }
            if (theirs * 2 > refs.length) ++captured;
            vm.revertToState(snap);
        }
        vm.assertLt(captured, 16, "a sybil majority in under 40% of the draws");
    }

    /// Attack (capture by newcomers): once a job exists, 32 sybils register at the minimum
    /// stake, outweighing its 5 outsiders (2 x the minimum each) 16 to 5, and challenge its
    /// honest vote. A job's referees come from the operators registered when it was created,
    /// weighed no heavier than they were then: over 20 seeds no sybil is ever drawn.
    function test_capture_sybilsRegisteredAfterTheJob_neverJudgeIt() public {
        redeploy();
        (uint256 honest,) = certify(0, 3, MIN_STAKE, bytes32(0));
        vm.roll(block.number + 1);
        address[] memory sybils = new address[](32);
        for (uint256 i; i < sybils.length; ++i) {
            sybils[i] = makeAddr(string.concat("late sybil", vm_toString(i)));
            register(sybils[i], MIN_STAKE);
        }
        challengeAs(sybils[0], honest);
        for (uint256 s; s < 20; ++s) {
            uint256 snap = vm.snapshotState();
            address[] memory refs = drawSeeded(honest, keccak256(abi.encode("late seed", s)));
            vm.assertEq(refs.length, 3);
            for (uint256 i; i < refs.length; ++i) {
                vm.assertTrue(isOutsider(refs[i]), "an operator registered before the job");
            }
            vm.revertToState(snap);
        }
    }

    /// Stake added after the job was created does not weigh in its draws: an outsider at the
    /// minimum then that tops up to the cap is drawn as often as the minimum says.
    function test_stakeAddedAfterTheJob_weighsNothingInItsDraws() public {
        redeploy();
        address late = makeAddr("topped up");
        register(late, MIN_STAKE);
        (uint256 honest,) = certify(0, 3, MIN_STAKE, bytes32(0));
        vm.roll(block.number + 1);
        vm.deal(late, 9 * MIN_STAKE);
        vm.prank(late);
        bsm.stake{value: 9 * MIN_STAKE}();
        challengeAs(outsiders[0], honest);
        uint256 drawn;
        for (uint256 s; s < 60; ++s) {
            uint256 snap = vm.snapshotState();
            address[] memory refs = drawSeeded(honest, keccak256(abi.encode("topped seed", s)));
            for (uint256 i; i < refs.length; ++i) {
                if (refs[i] == late) ++drawn;
            }
            vm.revertToState(snap);
        }
        // 3 of 5: four outsiders at 2 x the minimum and `late`, drawn in under half of the
        // draws at its weight then, in nearly all at the cap (10 against 2 each).
        vm.assertLt(drawn, 45, "weighed as it stood when the job was created");
    }

    /// Mines the seed block with hash `seed` and draws the referees of `jobId`'s challenge.
    function drawSeeded(uint256 jobId, bytes32 seed) internal returns (address[] memory) {
        vm.roll(block.number + 2);
        vm.setBlockhash(block.number - 1, seed);
        bsm.drawReferees(jobId, 0);
        return bsm.challengeOf(state(jobId).attempt).referees;
    }

    function isOutsider(address a) internal view returns (bool) {
        for (uint256 i; i < outsiders.length; ++i) {
            if (outsiders[i] == a) return true;
        }
        return false;
    }

    /// Attack: the only registered outsider is the attacker's: a jury of one would be the
    /// verdict. A jury below the minimum (a majority of `refereeCount`) decides nothing.
    function test_juryBelowTheMinimum_decidesNothing() public {
        I.Params memory p = defaultParams();
        p.challengeWindow = WINDOW;
        bsm = deployBSM(p);
        address lone = makeAddr("lone outsider");
        register(lone, MIN_STAKE);
        (uint256 other, address[] memory members) = certify(1, 2, MIN_STAKE, keccak256("fabricated"));
        challengeAs(members[0], other);
        vm.roll(block.number + 2);
        bsm.drawReferees(other, 0);
        address[] memory refs = bsm.challengeOf(state(other).attempt).referees;
        vm.assertEq(refs.length, 1);
        vm.warp(block.timestamp + WINDOW);
        uint32[] memory part = fullParticipation(other);
        bytes32 c = bsm.commitmentHash(other, 0, lone, keccak256("fabricated"), part, bytes32(0), bytes32(0));
        vm.prank(lone);
        bsm.commitVerdict(other, 0, c);
        vm.prank(lone);
        bsm.revealVerdict(other, 0, keccak256("fabricated"), part, 0, bytes32(0));
        bsm.resolveChallenge(other, 0);
        vm.assertEq(bsm.challengeOf(state(other).attempt).verdictKey, bytes32(0), "no verdict");
        vm.prank(reporter);
        bsm.finalizeEpoch(other, 0);
        vm.assertEq(bsm.epochCheckpoint(other, 0), trained(), "the certified vote stands");
        assertConserved();
    }

    function test_revert_SeedNotMined() public {
        vm.expectRevert(abi.encodeWithSelector(I.SeedNotMined.selector, block.number + 1, block.number));
        bsm.drawReferees(jobId, 0);
    }

    function test_revert_RefereesDrawnAlready() public {
        drawReferees(jobId);
        vm.expectRevert(abi.encodeWithSelector(I.RefereesDrawnAlready.selector, jobId, 0));
        bsm.drawReferees(jobId, 0);
    }

    /// A seed block out of the chain's reach is replaced by the block of the call.
    function test_staleSeed_renewedFromTheCallsBlock() public {
        uint256 opened = block.number;
        vm.roll(block.number + 300);
        vm.setBlockhash(opened + 1, bytes32(0));
        vm.expectEmit();
        emit I.RefereeSeedRenewed(jobId, 0, block.number);
        bsm.drawReferees(jobId, 0);
        vm.assertEq(bsm.challengeOf(state(jobId).attempt).referees.length, 0);
        vm.roll(block.number + 2);
        bsm.drawReferees(jobId, 0);
        vm.assertEq(bsm.challengeOf(state(jobId).attempt).referees.length, 3);
    }

    /// Findings name members: a bit at or above the member count is refused.
    function test_revert_FindingsOutOfRange() public {
        address[] memory refs = drawReferees(jobId);
        vm.warp(block.timestamp + WINDOW);
        uint32[] memory part = fullParticipation(jobId);
        uint256 bad = 1 << 3;
        bytes32 c = bsm.commitmentHash(jobId, 0, refs[0], trained(), part, bytes32(bad), bytes32(0));
        vm.prank(refs[0]);
        bsm.commitVerdict(jobId, 0, c);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(I.FindingsOutOfRange.selector, bad, 3));
        vm.prank(refs[0]);
        bsm.revealVerdict(jobId, 0, trained(), part, bad, bytes32(0));
    }

    function test_revert_NotAReferee_undrawn() public {
        address[] memory refs = drawReferees(jobId);
        vm.warp(block.timestamp + WINDOW);
        address undrawn;
        for (uint256 k; k < outsiders.length && undrawn == address(0); ++k) {
            bool drawn;
            for (uint256 i; i < refs.length; ++i) {
                drawn = drawn || refs[i] == outsiders[k];
            }
            if (!drawn) undrawn = outsiders[k];
        }
        vm.expectRevert(abi.encodeWithSelector(I.NotAReferee.selector, jobId, undrawn));
        vm.prank(undrawn);
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

    function test_postTranscript_byAVoterInTheFirstPhase() public {
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

    /// Attack: a deployment with the challenge window or the seat draw switched off (a vote
    /// final at once, seats to the first joiners). Refused on any chain but a development one.
    function test_revert_TrustSwitchedOff_outsideADevelopmentChain() public {
        deployBSM(defaultParams()); // the extensions, deployed once
        I.Params memory p = defaultParams();
        p.challengeWindow = WINDOW;
        p.seatDrawWindow = 60;
        vm.chainId(1);
        deployBSM(p);
        p.seatDrawWindow = 0;
        vm.expectRevert(abi.encodeWithSelector(I.TrustSwitchedOff.selector, 1, WINDOW, 0));
        deployBSM(p);
        (p.challengeWindow, p.seatDrawWindow) = (0, 60);
        vm.expectRevert(abi.encodeWithSelector(I.TrustSwitchedOff.selector, 1, 0, 60));
        deployBSM(p);
        vm.chainId(31_337);
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
        drawReferees(jobId);
        judge(jobId, trained());
        vm.prank(reporter);
        bsm.resolveChallenge(jobId, 0);
        finalizeNow(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Cancelled));
        vm.assertEq(bsm.epochCheckpoint(jobId, 0), trained());
        vm.assertEq(bsm.creditOf(ops[2]), PRICE * 40 / 100 + bondBack(), "paid, and its bond back");
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
        drawReferees(jobId);
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
        vm.assertEq(bsm.creditOf(honest), PRICE * 40 / 100 + bondBack(), "paid, and its bond back");
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
        drawReferees(jobId);
        judgeConsistent(jobId, trained(), fullParticipation(jobId), 7);
        uint256 treasury0 = bsm.creditOf(treasury);
        vm.prank(reporter);
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.creditOf(treasury), treasury0 + bondBack(), "the bond, less the referees' pay, to the treasury");
        vm.assertEq(bsm.creditOf(ops[0]), 0, "no bond back");
        assertConserved();
    }

    /// The referees must agree on whom they found consistent, not only on the vote: the one
    /// off the majority's bitmap is slashed like one off its vote.
    function test_refereeOffTheMajoritysBitmap_slashed() public {
        (uint256 jobId, address[] memory ops) = certify(2, 1, 100 ether, keccak256("x"));
        challengeAs(ops[2], jobId);
        address[] memory refs = drawReferees(jobId);
        uint32[] memory p = fullParticipation(jobId);
        uint256[3] memory bits = [uint256(7), 7, 3];
        vm.warp(bsm.challengeOf(state(jobId).attempt).openedAt + WINDOW);
        vm.assertEq(refs.length, 3, "all three drawn");
        for (uint256 i; i < 3; ++i) {
            commitIfDrawn(jobId, refs[i], keccak256("x"), p, bits[i]);
        }
        for (uint256 i; i < 3; ++i) {
            vm.prank(refs[i]);
            bsm.revealVerdict(jobId, 0, keccak256("x"), p, bits[i], saltOf(refs[i], keccak256("x")));
        }
        vm.prank(reporter);
        bsm.resolveChallenge(jobId, 0);
        vm.assertEq(bsm.challengeOf(state(jobId).attempt).consistent, 7, "the majority's bitmap");
        vm.assertLt(worth(refs[2]), 2 * MIN_STAKE, "the referee off the bitmap is slashed");
        vm.assertEq(bsm.stakeOf(refs[0], refs[0]), 2 * MIN_STAKE, "the majority is not");
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
        drawReferees(jobId);
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
        vm.assertEq(bsm.creditOf(ops[0]), PRICE * 40 / 100 + bondBack(), "the checker: paid, bond back");
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

/// Attack (free veto): 2 of 5 members reveal another vote, so that no vote reaches 2/3: with
/// no quorum nobody is judged on mismatch, the epoch is retried and the honest members work it
/// again unpaid, as often as the minority likes. An honest member takes the attempt to the
/// referees: their verdict settles it as a quorum would, the minority (whose own files do not
/// lead to its vote) is slashed as fabricators and the honest members are paid.
contract MinorityVetoTest is ChallengeBase {
    function test_minorityBlockingTheQuorum_isJudgedAndSlashed() public {
        (uint256 jobId, address[] memory ops) = certify(2, 3, MIN_STAKE, keccak256("veto"));
        vm.assertEq(bsm.challengeOf(state(jobId).attempt).challenger, address(0));
        (bytes32 certified,) = bsm.certifiedVote(jobId);
        vm.assertEq(certified, bytes32(0), "no quorum: 3 of 5");
        challengeAs(ops[4], jobId);
        vm.assertEq(bsm.challengeOf(state(jobId).attempt).certifiedKey, bytes32(0), "nothing was certified");
        uint256 honestBits = (1 << 2) | (1 << 3) | (1 << 4);
        judgeConsistent(jobId, trained(), fullParticipation(jobId), honestBits);
        bsm.resolveChallenge(jobId, 0);
        finalizeNow(jobId);
        vm.assertEq(bsm.epochCheckpoint(jobId, 0), trained(), "settled on the verdict, not retried");
        for (uint256 i; i < 2; ++i) {
            vm.assertEq(bsm.stakeOf(ops[i], ops[i]), MIN_STAKE * 9 / 10, "the minority: fabricators");
            vm.assertEq(bsm.creditOf(ops[i]), 0);
        }
        for (uint256 i = 2; i < 4; ++i) {
            vm.assertEq(bsm.creditOf(ops[i]), PRICE * 40 / 100, "an honest member is paid");
        }
        vm.assertEq(bsm.creditOf(ops[4]), PRICE * 40 / 100 + bondBack(), "paid, bond back less the pay");
        assertConserved();
    }
}
