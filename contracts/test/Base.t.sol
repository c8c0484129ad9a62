// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Test} from "./utils/Test.sol";
import {IBSM} from "./utils/IBSM.sol";
import {IDistributedTrainingBSMTypes as I} from "../src/interfaces/IDistributedTrainingBSM.sol";

/// Shared fixture: a BSM with the 40/20/20/20 split, funded actors and job helpers.
abstract contract BaseTest is Test {
    IBSM internal bsm;

    address internal treasury = makeAddr("treasury");
    address internal developer = makeAddr("developer");
    address internal core = makeAddr("core");
    address internal caller = makeAddr("caller");
    address internal staker = makeAddr("staker");
    address internal reporter = makeAddr("reporter");

    uint256 internal constant MIN_STAKE = 1 ether;
    uint256 internal constant PRICE = 0.1 ether;
    uint64 internal constant UNBONDING = 7 days;
    uint64 internal constant EPOCH = 1 hours;
    uint64 internal constant MIN_EPOCH = 10 minutes;
    uint64 internal constant GRACE = 5 minutes;
    uint64 internal constant REVEAL_WINDOW = 10 minutes;
    uint64 internal constant OPEN_TIMEOUT = 1 days;
    uint256 internal constant SEAT_BOND = 0.5 ether;
    uint16 internal constant COMP_BPS = 1000;
    uint96 internal constant MAX_BOUNTY = 0.01 ether;
    uint256 internal constant CHALLENGE_BOND = 1 ether;

    function defaultParams() internal view returns (I.Params memory) {
        return I.Params({
            operatorBps: 4000,
            stakerBps: 2000,
            protocolBps: 2000,
            developerBps: 2000,
            fabricationSlashBps: 1000,
            dropoutSlashBps: 500,
            syncFailSlashBps: 200,
            reporterBountyBps: 1000,
            syncThresholdBps: 5000,
            unworkableCompBps: COMP_BPS,
            maxOperators: 32,
            maxFailedEpochs: 3,
            refereeCount: 3,
            unbondingPeriod: UNBONDING,
            minEpochDuration: MIN_EPOCH,
            startGrace: GRACE,
            revealWindow: REVEAL_WINDOW,
            openTimeout: OPEN_TIMEOUT,
            challengeWindow: 0,
            seatDrawWindow: 0,
            maxReporterBounty: MAX_BOUNTY,
            minStake: MIN_STAKE,
            minSeatBond: SEAT_BOND,
            challengeBond: CHALLENGE_BOND,
            treasury: treasury,
            developer: developer,
            core: core
        });
    }

    /// The defaults with a one-hour challenge window.
    function challengeParams() internal view returns (I.Params memory p) {
        p = defaultParams();
        p.challengeWindow = 1 hours;
    }

    /// The defaults with seats drawn by stake a minute after `minOperators` applied.
    function seatDrawParams() internal view returns (I.Params memory p) {
        p = defaultParams();
        p.seatDrawWindow = 1 minutes;
    }

    /// The invariant campaigns' deployment: challenges and seat draws on.
    function campaignParams() internal view returns (I.Params memory p) {
        p = challengeParams();
        p.seatDrawWindow = 1 minutes;
    }

    /// The views extension (with its hooks extension) every BSM of a test delegates to: stateless,
    /// so deployed once.
    address internal views;

    /// Deploys from the artifacts (compiled through the IR pipeline) and bubbles up a
    /// constructor revert so that `vm.expectRevert` sees it.
    function deployBSM(I.Params memory p) internal returns (IBSM deployed) {
        if (views == address(0)) {
            address hooks = deployCode(vm.getCode("DistributedTrainingBSMHooks.sol:DistributedTrainingBSMHooks"));
            views = deployCode(
                abi.encodePacked(
                    vm.getCode("DistributedTrainingBSMViews.sol:DistributedTrainingBSMViews"), abi.encode(hooks)
                )
            );
        }
        deployed = IBSM(
            deployCode(
                abi.encodePacked(vm.getCode("DistributedTrainingBSM.sol:DistributedTrainingBSM"), abi.encode(p, views))
            )
        );
    }

    function deployCode(bytes memory code) internal returns (address a) {
        assembly ("memory-safe") {
            a := create(0, add(code, 32), mload(code))
            if iszero(a) {
                let m := mload(0x40)
                returndatacopy(m, 0, returndatasize())
                revert(m, returndatasize())
            }
        }
    }

    function setUp() public virtual {
        bsm = deployBSM(defaultParams());
        vm.deal(caller, 1_000_000 ether);
        vm.deal(staker, 1_000_000 ether);
    }

    function op(uint256 i) internal returns (address a) {
        a = makeAddr(string.concat("operator", vm_toString(i)));
    }

    function vm_toString(uint256 v) internal pure returns (string memory) {
        if (v == 0) return "0";
        bytes memory b;
        while (v > 0) {
            b = abi.encodePacked(bytes1(uint8(48 + v % 10)), b);
            v /= 10;
        }
        return string(b);
    }

    function peerKeyOf(address a) internal pure returns (bytes32) {
        return keccak256(abi.encode("ed25519", a));
    }

    function addrsOf(uint256 i) internal pure returns (string[] memory m) {
        m = new string[](1);
        m[0] = string.concat("/ip4/127.0.0.1/tcp/", vm_toString(40000 + i));
    }

    function register(address a, uint256 amount) internal {
        vm.deal(a, a.balance + amount);
        vm.prank(a);
        bsm.registerOperator{value: amount}(peerKeyOf(a), addrsOf(uint160(a) % 1000), "cpu:2", 0);
    }

    function registerN(uint256 n) internal returns (address[] memory ops) {
        ops = new address[](n);
        for (uint256 i; i < n; ++i) {
            ops[i] = op(i + 1);
            register(ops[i], MIN_STAKE);
        }
    }

    function spec(uint8 minOps, uint8 maxOps, uint32 epochs) internal pure returns (I.JobSpec memory s) {
        s = I.JobSpec({
            modelHash: keccak256("model"),
            modelUri: "builtin:llama-tiny",
            datasetHash: keccak256("dataset"),
            datasetUri: "file://corpus.jsonl",
            method: I.Method.CPT,
            totalEpochs: epochs,
            stepsPerEpoch: 40,
            syncInterval: 4,
            topkPerChunk: 4,
            quantBits: 2,
            minOperators: minOps,
            maxOperators: maxOps,
            epochDuration: EPOCH,
            teeRequired: false,
            pricePerOperatorEpoch: PRICE,
            seatBond: SEAT_BOND,
            recipeHash: bytes32(0),
            recipeUri: ""
        });
    }

    function escrowOf(I.JobSpec memory s) internal pure returns (uint256) {
        return s.pricePerOperatorEpoch * s.maxOperators * s.totalEpochs;
    }

    function createJob(I.JobSpec memory s) internal returns (uint256 jobId) {
        vm.prank(caller);
        jobId = bsm.createJob{value: escrowOf(s)}(s);
    }

    function joinAll(uint256 jobId, address[] memory ops) internal {
        for (uint256 i; i < ops.length; ++i) {
            vm.prank(ops[i]);
            bsm.joinJob(jobId);
        }
    }

    /// A running job with `n` members (min = n) of `epochs` epochs.
    function runningJob(uint256 n, uint32 epochs) internal returns (uint256 jobId, address[] memory ops) {
        ops = registerN(n);
        jobId = createJob(spec(uint8(n), uint8(n), epochs));
        joinAll(jobId, ops);
    }

    function fullParticipation(uint256 jobId) internal view returns (uint32[] memory p) {
        p = new uint32[](bsm.getMembers(jobId).length);
        for (uint256 i; i < p.length; ++i) {
            p[i] = 10;
        }
    }

    /// A vote committed and not yet revealed (the helpers reveal it when reveals open).
    struct Hidden {
        uint256 jobId;
        uint256 epoch;
        address op;
        bytes32 h;
        uint32[] p;
        bytes32 salt;
    }

    Hidden[] internal hidden;

    function saltOf(address a, bytes32 h) internal pure returns (bytes32) {
        return keccak256(abi.encode("salt", a, h));
    }

    /// The transcript hash `a`'s votes name (keccak, not the sha256 precompile: a precompile
    /// call would take a pending `vm.prank`).
    function transcriptOf(address a) internal pure returns (bytes32) {
        return keccak256(abi.encode("transcript", a));
    }

    /// Commits `a`'s vote (h, p); `reveal`/`finalize` reveal it once reveals are open.
    function submit(uint256 jobId, address a, bytes32 h, uint32[] memory p) internal {
        (, I.JobState memory st) = bsm.getJob(jobId);
        bytes32 salt = saltOf(a, h);
        bytes32 commitment = bsm.commitmentHash(jobId, st.epoch, a, h, p, transcriptOf(a), salt);
        vm.prank(a);
        bsm.commitCheckpoint(jobId, st.epoch, commitment);
        hidden.push(Hidden(jobId, st.epoch, a, h, p, salt));
    }

    /// Reveals every hidden vote of the job's epoch in progress, waiting for the commit deadline
    /// unless everyone committed.
    function reveal(uint256 jobId) internal {
        (, I.JobState memory st) = bsm.getJob(jobId);
        (uint256 committed,) = bsm.voteCounts(jobId);
        if (committed < bsm.getMembers(jobId).length && block.timestamp <= bsm.epochDeadline(jobId)) {
            vm.warp(bsm.epochDeadline(jobId) + 1);
        }
        for (uint256 i; i < hidden.length;) {
            Hidden storage v = hidden[i];
            if (v.jobId != jobId) {
                ++i;
                continue;
            }
            if (v.epoch == st.epoch) {
                vm.prank(v.op);
                bsm.revealCheckpoint(jobId, v.epoch, v.h, v.p, transcriptOf(v.op), v.salt);
            }
            hidden[i] = hidden[hidden.length - 1];
            hidden.pop();
        }
    }

    function submitAll(uint256 jobId, bytes32 h) internal {
        address[] memory m = bsm.getMembers(jobId);
        uint32[] memory p = fullParticipation(jobId);
        for (uint256 i; i < m.length; ++i) {
            submit(jobId, m[i], h, p);
        }
        reveal(jobId);
    }

    /// Reveals what is hidden, waits for the reveal deadline unless every member revealed,
    /// and finalizes as `reporter`.
    function finalize(uint256 jobId) internal {
        reveal(jobId);
        (, I.JobState memory st) = bsm.getJob(jobId);
        (, uint256 revealed) = bsm.voteCounts(jobId);
        if (revealed < bsm.getMembers(jobId).length && block.timestamp <= bsm.revealDeadline(jobId)) {
            vm.warp(bsm.revealDeadline(jobId) + 1);
        }
        vm.prank(reporter);
        bsm.finalizeEpoch(jobId, st.epoch);
    }

    function status(uint256 jobId) internal view returns (I.JobStatus) {
        (, I.JobState memory st) = bsm.getJob(jobId);
        return st.status;
    }

    function state(uint256 jobId) internal view returns (I.JobState memory st) {
        (, st) = bsm.getJob(jobId);
    }

    function assertConserved() internal view {
        (uint256 s, uint256 u, uint256 e, uint256 c, uint256 r) = bsm.accounting();
        vm.assertEq(address(bsm).balance, s + u + e + c + r, "balance != accounted");
    }
}
