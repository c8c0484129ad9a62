// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Test, Vm} from "../utils/Test.sol";
import {IBSM} from "../utils/IBSM.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

/// Drives random sequences of every state-changing call across several actors and keeps
/// running totals of the ether that entered and left, plus per-epoch settlement checks.
contract Handler is Test {
    IBSM public bsm;
    address public core;
    address public treasury;
    address public developer;

    address[] public operators;
    address[] public stakers;
    address[] public actors; // everyone who can hold a credit
    uint256[] public jobs;

    uint256 public ghostIn;
    uint256 public ghostOut;
    uint256 public ghostSlashed;
    uint256 public ghostPaidEpochs;
    uint256 public ghostSplitViolations;
    uint256 public ghostSettlementViolations;
    mapping(bytes4 => uint256) public calls;

    bytes32 private constant _PAID = keccak256("OperatorPaid(uint256,uint256,address,uint256)");
    bytes32 private constant _SLASHED = keccak256("Slashed(address,uint256,uint256,uint8,uint256,address)");

    constructor(IBSM bsm_, address core_, address treasury_, address developer_) {
        bsm = bsm_;
        core = core_;
        treasury = treasury_;
        developer = developer_;
        for (uint256 i; i < 4; ++i) {
            operators.push(makeAddr(string.concat("inv-operator", string(abi.encodePacked(bytes1(uint8(48 + i)))))));
            actors.push(operators[i]);
        }
        for (uint256 i; i < 3; ++i) {
            stakers.push(makeAddr(string.concat("inv-staker", string(abi.encodePacked(bytes1(uint8(48 + i)))))));
            actors.push(stakers[i]);
        }
        actors.push(makeAddr("inv-caller"));
        actors.push(makeAddr("inv-reporter"));
        actors.push(treasury_);
        actors.push(developer_);
    }

    function _op(uint256 s) internal view returns (address) {
        return operators[s % operators.length];
    }

    function _actor(uint256 s) internal view returns (address) {
        return actors[s % actors.length];
    }

    function _job(uint256 s) internal view returns (uint256) {
        return jobs.length == 0 ? 0 : jobs[s % jobs.length];
    }

    function _fund(address a, uint256 amount) internal {
        vm.deal(a, a.balance + amount);
        ghostIn += amount;
    }

    // ------------------------------------------------------------ staking

    function register(uint256 s, uint256 amount) external {
        address a = _op(s);
        if (bsm.getOperator(a).registered) return;
        amount = bound(amount, 1 ether, 20 ether);
        string[] memory m = new string[](1);
        m[0] = "/ip4/127.0.0.1/tcp/4001";
        _fund(a, amount);
        vm.prank(a);
        bsm.registerOperator{value: amount}(bytes32(uint256(uint160(a))), m, "cpu", 0);
    }

    function stake(uint256 s, uint256 amount) external {
        address a = _op(s);
        if (!bsm.getOperator(a).registered) return;
        amount = bound(amount, 1, 5 ether);
        _fund(a, amount);
        vm.prank(a);
        bsm.stake{value: amount}();
    }

    function unstake(uint256 s, uint256 amount) external {
        address a = _op(s);
        if (!bsm.getOperator(a).registered) return;
        uint256 have = bsm.stakeOf(a, a);
        if (have <= 1 ether) return;
        amount = bound(amount, 1, have - 1 ether);
        vm.prank(a);
        bsm.unstake(amount);
    }

    function deregister(uint256 s) external {
        address a = _op(s);
        I.OperatorInfo memory o = bsm.getOperator(a);
        if (!o.registered || o.activeJobs > 0) return;
        vm.prank(a);
        bsm.deregisterOperator();
    }

    function delegate(uint256 s, uint256 o, uint256 amount) external {
        address a = _op(o);
        if (!bsm.getOperator(a).registered) return;
        address st = stakers[s % stakers.length];
        amount = bound(amount, 1, 10 ether);
        _fund(st, amount);
        vm.prank(st);
        bsm.delegate{value: amount}(a);
    }

    function undelegate(uint256 s, uint256 o, uint256 amount) external {
        address a = _op(o);
        address st = stakers[s % stakers.length];
        uint256 have = bsm.stakeOf(a, st);
        if (have == 0) return;
        amount = bound(amount, 1, have);
        vm.prank(st);
        bsm.undelegate(a, amount);
    }

    function withdrawUnbonded(uint256 s, uint256 o) external {
        address a = _op(o);
        address who = _actor(s);
        (uint256 amount, uint64 unlockAt) = bsm.unbondingOf(a, who);
        if (amount == 0 && unlockAt == 0) return;
        if (block.timestamp < unlockAt) vm.warp(unlockAt);
        vm.prank(who);
        bsm.withdrawUnbonded(a);
    }

    function claim(uint256 s, uint256 o) external {
        vm.prank(_actor(s));
        bsm.claimRewards(_op(o));
    }

    function withdraw(uint256 s) external {
        address who = _actor(s);
        uint256 credit = bsm.creditOf(who);
        if (credit == 0) return;
        vm.prank(who);
        bsm.withdraw();
        ghostOut += credit;
    }

    function coreSlash(uint256 o, uint256 pct) external {
        pct = bound(pct, 1, 50);
        vm.prank(core);
        bsm.onSlash(0, abi.encode(_op(o)), uint8(pct));
    }

    function warp(uint256 dt) external {
        vm.warp(block.timestamp + bound(dt, 1, 2 hours));
    }

    // ------------------------------------------------------------ jobs

    function createJob(uint256 minOps, uint256 maxOps, uint256 epochs, uint256 price) external {
        maxOps = bound(maxOps, 1, 4);
        minOps = bound(minOps, 1, maxOps);
        I.JobSpec memory s = I.JobSpec({
            modelHash: keccak256("m"),
            modelUri: "",
            datasetHash: keccak256("d"),
            datasetUri: "",
            method: I.Method.SFT,
            totalEpochs: uint32(bound(epochs, 1, 3)),
            stepsPerEpoch: 8,
            syncInterval: 2,
            topkPerChunk: 4,
            quantBits: 1,
            minOperators: uint8(minOps),
            maxOperators: uint8(maxOps),
            epochDuration: 1 hours,
            teeRequired: false,
            pricePerOperatorEpoch: bound(price, 1, 1 ether)
        });
        uint256 escrow = s.pricePerOperatorEpoch * s.maxOperators * s.totalEpochs;
        address c = actors[7];
        _fund(c, escrow);
        vm.prank(c);
        jobs.push(bsm.createJob{value: escrow}(s));
    }

    function cancel(uint256 j) external {
        uint256 id = _job(j);
        if (id == 0) return;
        (, I.JobState memory st) = bsm.getJob(id);
        if (st.status != I.JobStatus.Open) return;
        vm.prank(st.caller);
        bsm.cancelJob(id);
    }

    function join(uint256 o, uint256 j) external {
        uint256 id = _job(j);
        if (id == 0) return;
        vm.prank(_op(o));
        bsm.joinJob(id);
    }

    function leave(uint256 o, uint256 j) external {
        uint256 id = _job(j);
        if (id == 0) return;
        vm.prank(_op(o));
        bsm.leaveJob(id);
    }

    /// Members mostly agree on one hash; `mode` picks forged hashes and low participation.
    function submit(uint256 j, uint256 mode) external {
        uint256 id = _job(j);
        if (id == 0) return;
        (, I.JobState memory st) = bsm.getJob(id);
        if (st.status != I.JobStatus.Running) return;
        address[] memory m = bsm.getMembers(id);
        uint32[] memory p = new uint32[](m.length);
        for (uint256 i; i < m.length; ++i) {
            p[i] = (mode >> (8 + i)) & 1 == 1 ? 0 : 4;
        }
        for (uint256 i; i < m.length; ++i) {
            if ((mode >> i) & 3 == 3) continue; // silent
            (bytes32 h,) = bsm.submissionOf(id, m[i]);
            if (h != bytes32(0)) continue;
            bytes32 ckpt =
                (mode >> (16 + i)) & 1 == 1 ? keccak256(abi.encode("forged", i)) : keccak256(abi.encode(id, st.epoch));
            vm.prank(m[i]);
            bsm.submitCheckpoint(id, st.epoch, ckpt, p);
        }
    }

    struct Books {
        uint256 held; // staked + unbonding
        uint256 escrow;
        uint256 owed; // credits + pool rewards
        uint256 developer;
    }

    function _books() internal view returns (Books memory b) {
        (uint256 s, uint256 u, uint256 e, uint256 c, uint256 r) = bsm.accounting();
        b = Books(s + u, e, c + r, bsm.creditOf(developer));
    }

    function finalize(uint256 j, uint256 r) external {
        uint256 id = _job(j);
        if (id == 0) return;
        (I.JobSpec memory spec, I.JobState memory st) = bsm.getJob(id);
        if (st.status != I.JobStatus.Running) return;
        if (bsm.submittedCount(id) < bsm.getMembers(id).length) vm.warp(bsm.epochDeadline(id) + 1);
        Books memory b0 = _books();
        vm.recordLogs();
        // The finalizer earns slash bounties, so it is never the developer (checked below).
        vm.prank(actors[r % 9]);
        bsm.finalizeEpoch(id, st.epoch);
        (uint256 paid, uint256 slashed) = _settledFromLogs(vm.getRecordedLogs());
        Books memory b1 = _books();
        (, st) = bsm.getJob(id);
        uint256 price = spec.pricePerOperatorEpoch;
        uint256 refund = b0.escrow - b1.escrow - paid * price; // underflow: escrow fell short
        bool ended = st.status == I.JobStatus.Completed || st.status == I.JobStatus.Failed;
        if (!ended && refund != 0) ++ghostSettlementViolations;
        // Everything that left escrow and stake arrived as credits or pool rewards.
        if (b1.owed - b0.owed != paid * price + slashed + refund) ++ghostSettlementViolations;
        if (b0.held - b1.held != slashed) ++ghostSettlementViolations;
        // The developer receives exactly its share of each paid operator-epoch.
        uint256 devCut = price * bsm.params().developerBps / 10000;
        if (b1.developer - b0.developer != paid * devCut) ++ghostSplitViolations;
        ghostPaidEpochs += paid;
        ghostSlashed += slashed;
    }

    function _settledFromLogs(Vm.Log[] memory logs) internal view returns (uint256 paid, uint256 slashed) {
        for (uint256 i; i < logs.length; ++i) {
            if (logs[i].emitter != address(bsm)) continue;
            if (logs[i].topics[0] == _PAID) ++paid;
            if (logs[i].topics[0] == _SLASHED) {
                (,, uint256 amount,) = abi.decode(logs[i].data, (uint256, uint8, uint256, address));
                slashed += amount;
            }
        }
    }

    function actorCount() external view returns (uint256) {
        return actors.length;
    }
}
