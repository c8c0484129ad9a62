// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

/// Seats by stake, not by speed: joining an `Open` job applies for a seat; `seatDrawWindow`
/// after the `minOperators`-th application anyone draws `maxOperators` seats by capped
/// self-stake and the epoch starts.
abstract contract SeatsBase is BaseTest {
    uint64 internal constant DRAW_WINDOW = 1 minutes;

    function setUp() public virtual override {
        super.setUp();
        bsm = deployBSM(seatDrawParams());
    }

    /// Registers `n` applicants (`stake` each) named `label`1..n and applies them to `jobId`.
    function applyN(uint256 jobId, string memory label, uint256 n, uint256 stake)
        internal
        returns (address[] memory ops)
    {
        ops = new address[](n);
        for (uint256 i; i < n; ++i) {
            ops[i] = makeAddr(string.concat(label, vm_toString(i + 1)));
            register(ops[i], stake);
        }
        joinAll(jobId, ops);
    }

    /// Seals the draw, mines the seed block with hash `randomness` and draws.
    function drawNow(uint256 jobId, uint256 randomness) internal {
        vm.warp(bsm.seatDrawAt(jobId));
        bsm.drawSeats(jobId);
        vm.roll(block.number + 2);
        vm.setBlockhash(block.number - 1, keccak256(abi.encode(randomness)));
        bsm.drawSeats(jobId);
    }

    /// A newcomer at twice the minimum joins a full list and displaces `lightest`.
    function joinHeavierThan(uint256 jobId, address lightest) internal {
        address heavy = makeAddr("heavy");
        register(heavy, 2 * MIN_STAKE);
        vm.expectEmit();
        emit I.SeatNotDrawn(jobId, 0, lightest);
        vm.prank(heavy);
        bsm.joinJob(jobId);
    }

    function seatsOf(uint256 jobId, address[] memory group) internal view returns (uint256 k) {
        address[] memory m = bsm.getMembers(jobId);
        for (uint256 i; i < m.length; ++i) {
            for (uint256 g; g < group.length; ++g) {
                if (m[i] == group[g]) ++k;
            }
        }
    }
}

contract JoinApplyTest is SeatsBase {
    function test_theMinOperatorsthApplicationSchedulesTheDrawAndStartsNothing() public {
        uint256 jobId = createJob(spec(2, 3, 1));
        applyN(jobId, "a", 1, MIN_STAKE);
        vm.assertEq(bsm.seatDrawAt(jobId), 0, "one applicant of two: nothing scheduled");
        address second = makeAddr("second");
        register(second, MIN_STAKE);
        vm.expectEmit();
        emit I.SeatDrawScheduled(jobId, 0, block.timestamp + DRAW_WINDOW);
        vm.prank(second);
        bsm.joinJob(jobId);
        vm.assertEq(bsm.seatDrawAt(jobId), block.timestamp + DRAW_WINDOW);
        vm.assertEq(uint256(status(jobId)), uint256(I.JobStatus.Open), "the epoch waits for the draw");
    }

    /// The attack: two sybils join a min-2 job first. Without a draw their second join starts
    /// the epoch with only them in it; with one, the honest operator that applies within the
    /// window is seated beside them.
    function test_twoSybilsJoiningFirstNoLongerOwnTheEpoch() public {
        uint256 jobId = createJob(spec(2, 3, 1));
        address[] memory sybils = applyN(jobId, "sybil", 2, MIN_STAKE);
        vm.assertEq(uint256(status(jobId)), uint256(I.JobStatus.Open));
        address[] memory honest = applyN(jobId, "honest", 1, 100 * MIN_STAKE);
        drawNow(jobId, 1);
        vm.assertEq(uint256(status(jobId)), uint256(I.JobStatus.Running));
        vm.assertEq(seatsOf(jobId, honest), 1, "the honest applicant holds a seat");
        vm.assertEq(seatsOf(jobId, sybils), 2);
    }

    function test_firstJoinersStartTheEpochWithoutADraw() public {
        bsm = deployBSM(defaultParams());
        uint256 jobId = createJob(spec(2, 3, 1));
        applyN(jobId, "sybil", 2, MIN_STAKE);
        vm.assertEq(uint256(status(jobId)), uint256(I.JobStatus.Running), "seatDrawWindow 0: first come");
        vm.assertEq(bsm.seatDrawAt(jobId), 0);
    }

    function test_revert_ApplicantsFull() public {
        uint256 jobId = createJob(spec(2, 3, 1));
        applyN(jobId, "crowd", 32, MIN_STAKE);
        address late = makeAddr("late");
        register(late, MIN_STAKE);
        vm.prank(late);
        vm.expectRevert(abi.encodeWithSelector(I.ApplicantsFull.selector, jobId, MIN_STAKE, MIN_STAKE));
        bsm.joinJob(jobId);
    }

    /// The attack: 32 minimum-stake addresses fill the list so nobody else can apply. A heavier
    /// applicant takes the lightest one's place; the displaced one gets its bond back.
    function test_crowdingTheListCostsStakeNotAddresses() public {
        uint256 jobId = createJob(spec(2, 3, 1));
        address[] memory crowd = applyN(jobId, "crowd", 32, MIN_STAKE);
        joinHeavierThan(jobId, crowd[0]);
        address[] memory m = bsm.getMembers(jobId);
        vm.assertEq(m.length, 32);
        vm.assertEq(seatsOf(jobId, crowd), 31);
        vm.assertEq(bsm.bondedOf(crowd[0]), 0, "the displaced applicant's bond is released");
        vm.assertEq(bsm.getOperator(crowd[0]).activeJobs, 0);
        assertConserved();
    }

    function test_aLeaveBelowMinOperatorsUnschedulesTheDraw() public {
        uint256 jobId = createJob(spec(2, 3, 1));
        address[] memory ops = applyN(jobId, "a", 2, MIN_STAKE);
        vm.prank(ops[0]);
        bsm.leaveJob(jobId);
        vm.assertEq(bsm.seatDrawAt(jobId), 0);
        vm.warp(block.timestamp + DRAW_WINDOW);
        vm.expectRevert(abi.encodeWithSelector(I.SeatDrawNotDue.selector, jobId, 0, block.timestamp));
        bsm.drawSeats(jobId);
        // the next `minOperators`-th applicant schedules a full window from its own join
        applyN(jobId, "b", 1, MIN_STAKE);
        vm.assertEq(bsm.seatDrawAt(jobId), block.timestamp + DRAW_WINDOW);
    }
}

contract DrawSeatsTest is SeatsBase {
    function test_revert_SeatDrawNotDue() public {
        uint256 jobId = createJob(spec(2, 3, 1));
        applyN(jobId, "a", 2, MIN_STAKE);
        uint256 at = bsm.seatDrawAt(jobId);
        vm.warp(at - 1);
        vm.expectRevert(abi.encodeWithSelector(I.SeatDrawNotDue.selector, jobId, at, at - 1));
        bsm.drawSeats(jobId);
    }

    function test_revert_JobNotOpen() public {
        uint256 jobId = createJob(spec(2, 3, 1));
        applyN(jobId, "a", 2, MIN_STAKE);
        drawNow(jobId, 7);
        vm.expectRevert(abi.encodeWithSelector(I.JobNotOpen.selector, jobId, I.JobStatus.Running));
        bsm.drawSeats(jobId);
    }

    function test_drawSeatsMaxOperatorsReleasesTheRestAndStartsTheEpoch() public {
        uint256 jobId = createJob(spec(2, 3, 1));
        address[] memory ops = applyN(jobId, "a", 5, MIN_STAKE);
        uint256 before = bsm.stakeOf(ops[0], ops[0]);
        drawNow(jobId, 42);
        address[] memory m = bsm.getMembers(jobId);
        vm.assertEq(m.length, 3);
        vm.assertEq(uint256(status(jobId)), uint256(I.JobStatus.Running));
        vm.assertEq(state(jobId).epochStart, block.timestamp + GRACE);
        vm.assertEq(bsm.seatDrawAt(jobId), 0);
        uint256 seated;
        for (uint256 i; i < ops.length; ++i) {
            bool isMember = seatsOf(jobId, single(ops[i])) == 1;
            vm.assertEq(bsm.bondedOf(ops[i]), isMember ? SEAT_BOND : 0);
            vm.assertEq(bsm.getOperator(ops[i]).activeJobs, isMember ? 1 : 0);
            vm.assertEq(bsm.stakeOf(ops[i], ops[i]), before, "a draw takes nobody's stake");
            if (isMember) ++seated;
        }
        vm.assertEq(seated, 3);
        assertConserved();
    }

    /// A coalition of 4 of 12 equal applicants (a third of the stake) drawn into 6 seats over
    /// 300 draws: it averages a third of the seats, and holds 2/3 of them about as often as the
    /// hypergeometric law says (C(4,4)C(8,2)/C(12,6) = 28/924 = 3.0%).
    function test_aCoalitionsSeatsFollowItsShareOfTheStake() public {
        uint256 jobId = createJob(spec(2, 6, 1));
        address[] memory coalition = applyN(jobId, "coalition", 4, MIN_STAKE);
        applyN(jobId, "honest", 8, MIN_STAKE);
        uint256 at = bsm.seatDrawAt(jobId);
        (uint256 seats, uint256 twoThirds) = sample(jobId, coalition, at, 300);
        vm.assertApproxEqAbs(seats, 300 * 2, 60, "a third of 6 seats on average");
        vm.assertLe(twoThirds, 24, "2/3 of the seats in ~3% of draws, not more");
        vm.assertGe(twoThirds, 1);
    }

    /// Weight is self-stake capped at SEAT_WEIGHT_CAP x minStake: ten times the stake is ten
    /// times the weight up to the cap, and no more beyond it.
    function test_weightIsSelfStakeCapped() public {
        address small = makeAddr("small");
        address whale = makeAddr("whale");
        register(small, MIN_STAKE);
        register(whale, 1000 * MIN_STAKE);
        vm.assertEq(bsm.seatWeight(small), MIN_STAKE);
        vm.assertEq(bsm.seatWeight(whale), bsm.SEAT_WEIGHT_CAP() * MIN_STAKE);
    }

    /// One applicant at the weight cap beside four at the minimum (weights 10:1:1:1:1) for the
    /// 2 seats of a job: it is seated in about 93% of draws, a light one in about 27%.
    function test_heavierApplicantsAreDrawnMoreOften() public {
        uint256 jobId = createJob(spec(2, 2, 1));
        address[] memory heavy = applyN(jobId, "heavy", 1, 10 * MIN_STAKE);
        applyN(jobId, "light", 4, MIN_STAKE);
        uint256 at = bsm.seatDrawAt(jobId);
        (uint256 seats,) = sample(jobId, heavy, at, 200);
        // P(heavy seated) = 10/14 + (4/14)(10/13) = 0.934
        vm.assertGe(seats, 170, "about 187 of 200");
    }

    function testFuzz_drawSeatsMinOfApplicantsAndMaxOperators(uint8 applicants, uint8 maxOps, uint256 seed) public {
        maxOps = uint8(bound(maxOps, 2, 32));
        applicants = uint8(bound(applicants, 2, 32));
        uint256 jobId = createJob(spec(2, maxOps, 1));
        address[] memory ops = applyN(jobId, "a", applicants, MIN_STAKE);
        drawNow(jobId, seed);
        address[] memory m = bsm.getMembers(jobId);
        uint256 want = applicants < maxOps ? applicants : maxOps;
        vm.assertEq(m.length, want);
        vm.assertEq(seatsOf(jobId, ops), want, "every seat holder applied, none twice");
        uint256 bonded;
        for (uint256 i; i < ops.length; ++i) {
            bonded += bsm.bondedOf(ops[i]);
        }
        vm.assertEq(bonded, want * SEAT_BOND);
        assertConserved();
    }

    function sample(uint256 jobId, address[] memory group, uint256 at, uint256 runs)
        internal
        returns (uint256 seats, uint256 twoThirds)
    {
        vm.warp(at);
        bsm.drawSeats(jobId); // sealedAt
        vm.roll(block.number + 2);
        uint256 snap = vm.snapshotState();
        for (uint256 r; r < runs; ++r) {
            vm.setBlockhash(block.number - 1, keccak256(abi.encode("draw", r)));
            bsm.drawSeats(jobId);
            uint256 k = seatsOf(jobId, group);
            uint256 n = bsm.getMembers(jobId).length;
            seats += k;
            if (k * 3 >= n * 2) ++twoThirds;
            vm.revertToState(snap);
        }
    }

    function single(address a) internal pure returns (address[] memory g) {
        g = new address[](1);
        g[0] = a;
    }
}

/// Attack (grinding): once the seed is known, an applicant moves 1 wei of stake, joins with
/// another address or leaves to re-roll the draw. Applications close when the draw is due,
/// the weights stand as of the sealing block, and the seed is the next block's hash.
contract SeatGrindingTest is SeatsBase {
    function test_revert_SeatApplicationsClosed_joinAndLeaveOnceTheDrawIsDue() public {
        uint256 jobId = createJob(spec(2, 2, 1));
        address[] memory ops = applyN(jobId, "a", 3, MIN_STAKE);
        uint256 at = bsm.seatDrawAt(jobId);
        vm.warp(at);
        address late = makeAddr("late");
        register(late, MIN_STAKE);
        vm.expectRevert(abi.encodeWithSelector(I.SeatApplicationsClosed.selector, jobId, at));
        vm.prank(late);
        bsm.joinJob(jobId);
        vm.expectRevert(abi.encodeWithSelector(I.SeatApplicationsClosed.selector, jobId, at));
        vm.prank(ops[0]);
        bsm.leaveJob(jobId);
    }

    function test_sealThenDraw_theSeedBlockMustBeMined() public {
        uint256 jobId = createJob(spec(2, 2, 1));
        applyN(jobId, "a", 3, MIN_STAKE);
        vm.warp(bsm.seatDrawAt(jobId));
        vm.expectEmit();
        emit I.SeatDrawSealed(jobId, 0, block.number + 1);
        bsm.drawSeats(jobId);
        vm.assertEq(uint256(status(jobId)), uint256(I.JobStatus.Open), "sealedAt, not drawn");
        vm.roll(block.number + 1);
        vm.expectRevert(abi.encodeWithSelector(I.SeedNotMined.selector, block.number, block.number));
        bsm.drawSeats(jobId);
        vm.roll(block.number + 1);
        bsm.drawSeats(jobId);
        vm.assertEq(bsm.getMembers(jobId).length, 2);
        vm.assertEq(uint256(status(jobId)), uint256(I.JobStatus.Running));
    }

    function test_stakeMovedAfterTheSealChangesNothing() public {
        uint256 jobId = createJob(spec(2, 2, 1));
        address[] memory ops = applyN(jobId, "a", 5, MIN_STAKE);
        vm.warp(bsm.seatDrawAt(jobId));
        bsm.drawSeats(jobId);
        vm.roll(block.number + 2);
        uint256 snap = vm.snapshotState();
        bsm.drawSeats(jobId);
        address[] memory expected = bsm.getMembers(jobId);
        vm.revertToState(snap);
        for (uint256 i; i < ops.length; ++i) {
            vm.deal(ops[i], 9 * MIN_STAKE);
            vm.prank(ops[i]);
            bsm.stake{value: i == 0 ? 1 : 9 * MIN_STAKE}();
        }
        bsm.drawSeats(jobId);
        address[] memory seated = bsm.getMembers(jobId);
        vm.assertEq(seated.length, expected.length);
        for (uint256 i; i < seated.length; ++i) {
            vm.assertEq(seated[i], expected[i], "the same seats");
        }
    }

    /// A seed block out of the chain's reach reseals from the calling block.
    function test_staleSeed_resealed() public {
        uint256 jobId = createJob(spec(2, 2, 1));
        applyN(jobId, "a", 3, MIN_STAKE);
        vm.warp(bsm.seatDrawAt(jobId));
        bsm.drawSeats(jobId);
        uint256 seedBlock = block.number + 1;
        vm.roll(block.number + 300);
        vm.setBlockhash(seedBlock, bytes32(0));
        vm.expectEmit();
        emit I.SeatDrawSealed(jobId, 0, block.number + 1);
        bsm.drawSeats(jobId);
        vm.roll(block.number + 2);
        bsm.drawSeats(jobId);
        vm.assertEq(uint256(status(jobId)), uint256(I.JobStatus.Running));
    }
}

/// Vacancies by stake, not by speed: joining a `Running` job queues for a seat of the next
/// epoch. Applications close at the epoch's first reveal (the seal: weights as of its block,
/// the next block's hash the seed); at the boundary the free seats are drawn among the queue
/// by capped self-stake, and those not drawn stay queued for the next boundary.
contract VacancyDrawTest is SeatsBase {
    /// A running job whose open draw seated `seated` of its `maxOps` seats.
    function runningWithFreeSeats(uint8 maxOps, uint256 seated) internal returns (uint256 jobId) {
        jobId = createJob(spec(2, maxOps, 4));
        applyN(jobId, "first", seated, MIN_STAKE);
        drawNow(jobId, 1);
    }

    /// Commits and reveals the epoch (the first reveal seals the queue), mines the seed block
    /// with hash `randomness` and finalizes.
    function boundary(uint256 jobId, uint256 randomness) internal {
        submitAll(jobId, keccak256("ckpt"));
        uint256 sealedAt = block.number;
        vm.roll(sealedAt + 2);
        vm.setBlockhash(sealedAt + 1, keccak256(abi.encode(randomness)));
        finalize(jobId);
    }

    /// The attack: a job drew only 2 applicants for its 8 seats; six minimum-stake sybils
    /// queue first for the six free seats of epoch 1. First come, they held all six and the
    /// honest operators that came later were refused (`JobFull`); drawn by stake, the honest
    /// queue (10x the weight) takes most of the seats and the sybils wait.
    function test_sybilsQueuingFirstNoLongerOwnTheFreeSeats() public {
        uint256 jobId = runningWithFreeSeats(8, 2);
        address[] memory sybils = applyN(jobId, "sybil", 6, MIN_STAKE);
        address[] memory honest = applyN(jobId, "honest", 6, 10 * MIN_STAKE);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 12, "everyone queued");
        boundary(jobId, 3);
        vm.assertEq(bsm.getMembers(jobId).length, 8);
        vm.assertGe(seatsOf(jobId, honest), 4, "most free seats go to the heavier queue");
        vm.assertEq(seatsOf(jobId, honest) + seatsOf(jobId, sybils), 6);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 6, "the others stay queued");
        assertConserved();
    }

    /// Over 200 seeds, 6 applicants at the cap beside 6 at the minimum (10:1) for 6 seats:
    /// the heavy six average more than 5 seats, and hold all six now and then.
    function test_seatsFollowTheQueuesWeights() public {
        uint256 jobId = runningWithFreeSeats(8, 2);
        applyN(jobId, "sybil", 6, MIN_STAKE);
        address[] memory honest = applyN(jobId, "honest", 6, 10 * MIN_STAKE);
        submitAll(jobId, keccak256("ckpt"));
        uint256 sealedAt = block.number;
        vm.roll(sealedAt + 2);
        uint256 snap = vm.snapshotState();
        uint256 seats;
        for (uint256 r; r < 200; ++r) {
            vm.setBlockhash(sealedAt + 1, keccak256(abi.encode("vacancy", r)));
            finalize(jobId);
            seats += seatsOf(jobId, honest);
            vm.revertToState(snap);
        }
        vm.assertGe(seats, 200 * 5, "more than 5 of 6 seats on average");
        vm.assertLe(seats, 200 * 6 - 40, "the light queue is drawn too");
    }

    /// Attack (grinding): once the seed is known, join with another address, leave the
    /// queue, or move stake. Applications close at the first reveal; weights stand as of it.
    function test_revert_SeatApplicationsClosed_joinAndLeaveOnceAVoteIsRevealed() public {
        uint256 jobId = runningWithFreeSeats(4, 2);
        address[] memory queued = applyN(jobId, "q", 3, MIN_STAKE);
        submitAll(jobId, keccak256("ckpt"));
        address late = makeAddr("late");
        register(late, MIN_STAKE);
        vm.expectRevert(abi.encodeWithSelector(I.SeatApplicationsClosed.selector, jobId, 0));
        vm.prank(late);
        bsm.joinJob(jobId);
        vm.expectRevert(abi.encodeWithSelector(I.SeatApplicationsClosed.selector, jobId, 0));
        vm.prank(queued[0]);
        bsm.leaveJob(jobId);
    }

    function test_stakeMovedAfterTheSealChangesNothing() public {
        uint256 jobId = runningWithFreeSeats(4, 2);
        address[] memory queued = applyN(jobId, "q", 5, MIN_STAKE);
        submitAll(jobId, keccak256("ckpt"));
        vm.roll(block.number + 2);
        uint256 snap = vm.snapshotState();
        finalize(jobId);
        address[] memory expected = bsm.getMembers(jobId);
        vm.assertEq(expected.length, 4, "two of five drawn");
        vm.revertToState(snap);
        for (uint256 i; i < queued.length; ++i) {
            vm.deal(queued[i], 9 * MIN_STAKE);
            vm.prank(queued[i]);
            bsm.stake{value: i == 0 ? 1 : 9 * MIN_STAKE}();
        }
        finalize(jobId);
        address[] memory seated = bsm.getMembers(jobId);
        vm.assertEq(seated.length, expected.length);
        for (uint256 i; i < seated.length; ++i) {
            vm.assertEq(seated[i], expected[i], "the same seats");
        }
    }

    /// No free seat: the queue waits, bonded, for a boundary that frees one.
    function test_noFreeSeat_theQueueWaits() public {
        uint256 jobId = runningWithFreeSeats(2, 2);
        address[] memory queued = applyN(jobId, "q", 3, MIN_STAKE);
        boundary(jobId, 5);
        vm.assertEq(bsm.getMembers(jobId).length, 2);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 3);
        vm.assertEq(bsm.bondedOf(queued[0]), SEAT_BOND, "still queued, still bonded");
        address leaving = bsm.getMembers(jobId)[0];
        vm.prank(leaving);
        bsm.leaveJob(jobId);
        boundary(jobId, 6);
        vm.assertEq(bsm.getMembers(jobId).length, 2, "one seat freed, one drawn");
        vm.assertEq(seatsOf(jobId, queued), 1);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 2);
        assertConserved();
    }

    /// A boundary in the seal's own block or the next has no seed yet: nobody is seated from
    /// the queue (no caller picks the block that draws), and the next epoch draws them.
    function test_seedNotMinedAtTheBoundary_theQueueWaitsAnEpoch() public {
        uint256 jobId = runningWithFreeSeats(3, 2);
        address[] memory queued = applyN(jobId, "q", 2, MIN_STAKE);
        submitAll(jobId, keccak256("ckpt"));
        finalize(jobId);
        vm.assertEq(bsm.getMembers(jobId).length, 2, "no seed, no draw");
        vm.assertEq(bsm.getPendingJoins(jobId).length, 2);
        boundary(jobId, 7);
        vm.assertEq(seatsOf(jobId, queued), 1);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 1);
    }

    /// Fewer queued than free seats: all are seated without a draw, as without draws.
    function test_roomForAll_everyoneQueuedIsSeated() public {
        uint256 jobId = runningWithFreeSeats(5, 2);
        address[] memory queued = applyN(jobId, "q", 3, MIN_STAKE);
        submitAll(jobId, keccak256("ckpt"));
        finalize(jobId);
        vm.assertEq(seatsOf(jobId, queued), 3);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 0);
    }

    /// The queue holds 32 applicants with the members; a heavier newcomer displaces the
    /// lightest queued one (never a member).
    function test_aFullQueueTakesAHeavierNewcomerInPlaceOfItsLightest() public {
        uint256 jobId = runningWithFreeSeats(3, 2);
        address[] memory crowd = applyN(jobId, "crowd", 30, MIN_STAKE);
        address late = makeAddr("late");
        register(late, MIN_STAKE);
        vm.expectRevert(abi.encodeWithSelector(I.ApplicantsFull.selector, jobId, MIN_STAKE, MIN_STAKE));
        vm.prank(late);
        bsm.joinJob(jobId);
        joinHeavierThan(jobId, crowd[0]);
        vm.assertEq(bsm.getMembers(jobId).length, 2);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 30);
        vm.assertEq(bsm.bondedOf(crowd[0]), 0);
        assertConserved();
    }
}
