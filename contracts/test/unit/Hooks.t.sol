// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";
import {IBlueprintServiceManager, TangleTypes} from "../../src/interfaces/IBlueprintServiceManager.sol";

/// Calls the hooks exactly as tnt-core (8a2b24c1) does: `manager.call{gas: 500_000}(data)`
/// with no ether, the caller's own address as the `operator` it vouches for, the slash offender
/// as `abi.encodePacked(operator)`. A failed hook reverts here (the core's `_callManager`).
contract TangleCoreHarness {
    /// tnt-core's gas per hook call; `make gas` raises it (env `HOOK_GAS_CAP`) only to measure
    /// calls that exceed it with cold storage (`forge test --isolate`).
    uint256 public immutable HOOK_GAS;
    address public manager;
    uint64 public nextCallId = 1;
    uint256 public lastGas;
    uint256 public maxGas;

    constructor(uint256 cap) {
        HOOK_GAS = cap;
    }

    function setManager(address m) external {
        manager = m;
    }

    function _call(bytes memory data) internal {
        uint256 g = gasleft();
        (bool ok, bytes memory ret) = manager.call{gas: HOOK_GAS}(data);
        lastGas = g - gasleft();
        if (lastGas > maxGas) maxGas = lastGas;
        if (!ok) {
            assembly ("memory-safe") {
                revert(add(ret, 32), mload(ret))
            }
        }
    }

    function createBlueprint(uint64 blueprintId) external {
        _call(abi.encodeCall(IBlueprintServiceManager.onBlueprintCreated, (blueprintId, msg.sender, address(this))));
    }

    /// The sender registers itself (Operators.registerOperator in the core).
    function registerOperator(bytes calldata payload) external {
        _call(abi.encodeCall(IBlueprintServiceManager.onRegister, (msg.sender, payload)));
    }

    function unregisterOperator() external {
        _call(abi.encodeCall(IBlueprintServiceManager.onUnregister, (msg.sender)));
    }

    function requestService(address[] calldata operators, bytes calldata config, uint256 payment) external {
        _call(
            abi.encodeCall(
                IBlueprintServiceManager.onRequest, (1, msg.sender, operators, config, 0, address(0), payment)
            )
        );
    }

    /// Any permitted caller submits a job call; nothing in `inputs` is vouched for.
    function submitJob(uint8 job, bytes calldata inputs) external {
        _call(abi.encodeCall(IBlueprintServiceManager.onJobCall, (7, job, nextCallId++, inputs)));
    }

    /// The sender, an operator of the service, submits a result.
    function submitResult(uint8 job, bytes calldata outputs) external {
        _call(
            abi.encodeCall(
                IBlueprintServiceManager.onJobResult, (7, job, nextCallId++, msg.sender, keccak256(outputs), outputs)
            )
        );
    }

    function slash(address operator, uint8 percent) external {
        _call(abi.encodeCall(IBlueprintServiceManager.onSlash, (7, abi.encodePacked(operator), percent)));
    }
}

abstract contract HooksBase is BaseTest {
    event log_named_uint(string key, uint256 val);

    uint8 internal constant JOIN = 1;
    uint8 internal constant LEAVE = 2;
    uint8 internal constant COMMIT = 3;
    uint8 internal constant REVEAL = 4;
    uint8 internal constant FINALIZE = 5;

    TangleCoreHarness internal tangle;

    function setUp() public virtual override {
        tangle = new TangleCoreHarness(vm.envOr("HOOK_GAS_CAP", uint256(500_000)));
        core = address(tangle);
        super.setUp();
        tangle.setManager(address(bsm));
    }

    function keyOf(uint256 i) internal pure returns (uint256) {
        return uint256(keccak256(bytes(string.concat("operator", vm_toString(i)))));
    }

    function coreRegister(address a) internal {
        vm.prank(a);
        tangle.registerOperator(abi.encode(peerKeyOf(a), addrsOf(1), "cpu:2", uint256(0)));
    }

    /// `args` signed by `key` for the job's current attempt, valid for an hour.
    function signed(uint256 key, uint8 job, bytes memory args) internal view returns (bytes memory) {
        uint64 attempt = args.length >= 32 ? state(abi.decode(args, (uint256))).attempt : 0;
        return signedFor(key, job, args, attempt, uint64(block.timestamp + 1 hours));
    }

    function signedFor(uint256 key, uint8 job, bytes memory args, uint64 attempt, uint64 deadline)
        internal
        view
        returns (bytes memory)
    {
        address a = vm.addr(key);
        bytes32 domain = keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("DistributedTrainingBSM"),
                keccak256("1"),
                block.chainid,
                address(bsm)
            )
        );
        bytes32 structHash = keccak256(
            abi.encode(
                keccak256("OperatorCall(uint8 job,bytes args,uint256 nonce,uint64 attempt,uint64 deadline)"),
                job,
                keccak256(args),
                bsm.operatorNonce(a),
                attempt,
                deadline
            )
        );
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(key, keccak256(abi.encodePacked("\x19\x01", domain, structHash)));
        return abi.encode(a, args, attempt, deadline, abi.encodePacked(r, s, v));
    }

    /// Each of `voters` commits (h, p) by sending a result, then reveals once reveals are open.
    function hookVote(uint256 jobId, address[] memory voters, bytes32 h, uint32[] memory p) internal {
        uint256 e = state(jobId).epoch;
        for (uint256 i; i < voters.length; ++i) {
            bytes32 c = bsm.commitmentHash(jobId, e, voters[i], h, p, transcriptOf(voters[i]), saltOf(voters[i], h));
            vm.prank(voters[i]);
            tangle.submitResult(COMMIT, abi.encode(jobId, e, c));
        }
        if (voters.length < bsm.getMembers(jobId).length) vm.warp(bsm.epochDeadline(jobId) + 1);
        for (uint256 i; i < voters.length; ++i) {
            vm.prank(voters[i]);
            tangle.submitResult(REVEAL, abi.encode(jobId, e, h, p, transcriptOf(voters[i]), saltOf(voters[i], h)));
        }
        if (voters.length < bsm.getMembers(jobId).length) vm.warp(bsm.revealDeadline(jobId) + 1);
    }

    /// Finalizes through the hooks in pieces until the epoch ends; returns the calls made.
    function hookFinalize(uint256 jobId) internal returns (uint256 calls) {
        uint256 epoch = state(jobId).epoch;
        uint64 attempt = state(jobId).attempt;
        while (state(jobId).epoch == epoch && state(jobId).attempt == attempt && status(jobId) == I.JobStatus.Running) {
            tangle.submitJob(FINALIZE, abi.encode(jobId, epoch));
            emit log_named_uint("finalize hook gas", tangle.lastGas());
            vm.assertLe(tangle.lastGas(), tangle.HOOK_GAS(), "hook over the core's gas cap");
            ++calls;
        }
    }
}

/// A whole job driven through the hooks as the core calls them.
contract HooksTest is HooksBase {
    function test_wholeJobThroughHooks() public {
        tangle.createBlueprint(1);
        address[] memory ops = new address[](3);
        for (uint256 i; i < 3; ++i) {
            ops[i] = op(i + 1);
            coreRegister(ops[i]);
            vm.assertTrue(bsm.getOperator(ops[i]).registered);
            // The core forwards no ether: the operator stakes directly.
            vm.deal(ops[i], MIN_STAKE);
            vm.prank(ops[i]);
            bsm.stake{value: MIN_STAKE}();
        }
        // A request is checked, creates nothing and joins nobody.
        I.JobSpec memory s = spec(3, 3, 2);
        vm.prank(caller);
        tangle.requestService(ops, abi.encode(s), escrowOf(s));
        vm.assertEq(bsm.nextJobId(), 1);
        uint256 jobId = createJob(s);
        // One operator joins by sending a result (the core vouches for the sender), the
        // others through job calls they signed.
        vm.prank(ops[0]);
        tangle.submitResult(JOIN, abi.encode(jobId));
        tangle.submitJob(JOIN, signed(keyOf(2), JOIN, abi.encode(jobId)));
        tangle.submitJob(JOIN, signed(keyOf(3), JOIN, abi.encode(jobId)));
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Running));
        for (uint256 e; e < 2; ++e) {
            hookVote(jobId, bsm.getMembers(jobId), keccak256(abi.encode(e)), fullParticipation(jobId));
            hookFinalize(jobId);
        }
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        vm.assertEq(state(jobId).checkpoint, keccak256(abi.encode(uint256(1))));
        vm.assertEq(bsm.creditOf(ops[0]), 2 * PRICE * 40 / 100);
        vm.assertEq(bsm.creditOf(developer), 6 * PRICE * 20 / 100);
        vm.prank(ops[0]);
        tangle.unregisterOperator();
        vm.assertFalse(bsm.getOperator(ops[0]).registered);
        assertConserved();
    }

    function test_leaveThroughJobResult() public {
        address a = op(1);
        register(a, MIN_STAKE);
        uint256 jobId = createJob(spec(2, 2, 1));
        vm.prank(a);
        tangle.submitResult(JOIN, abi.encode(jobId));
        vm.assertEq(bsm.getMembers(jobId).length, 1);
        vm.prank(a);
        tangle.submitResult(LEAVE, abi.encode(jobId));
        vm.assertEq(bsm.getMembers(jobId).length, 0);
    }

    /// The core passes the offender as 20 packed bytes.
    function test_onSlashTakesPackedOffender() public {
        address a = op(1);
        register(a, MIN_STAKE);
        vm.prank(staker);
        bsm.delegate{value: 1 ether}(a);
        tangle.slash(a, 20);
        vm.assertEq(bsm.stakeOf(a, staker), 0.8 ether);
        vm.assertEq(bsm.creditOf(treasury), 0.4 ether);
        assertConserved();
    }

    /// Attack: ether sent with a hook that keeps no state would be locked in the BSM forever
    /// (nobody's credit). Refused.
    function test_revert_EtherNotAccepted_noOpHooks() public {
        IBlueprintServiceManager m = IBlueprintServiceManager(address(bsm));
        vm.deal(core, 2);
        vm.startPrank(core);
        vm.expectRevert(abi.encodeWithSelector(I.EtherNotAccepted.selector, 1));
        m.onUpdatePreferences{value: 1}(op(1), "");
        vm.expectRevert(abi.encodeWithSelector(I.EtherNotAccepted.selector, 1));
        m.onApprove{value: 1}(op(1), 1, 50);
        vm.stopPrank();
        assertConserved();
    }

    /// Every hook of tnt-core's interface exists and succeeds when called as the core does.
    function test_everyHookExists() public {
        IBlueprintServiceManager m = IBlueprintServiceManager(address(bsm));
        vm.startPrank(core);
        m.onUpdatePreferences(op(1), "");
        m.onApprove(op(1), 1, 50);
        m.onReject(op(1), 1);
        m.onServiceInitialized(1, 1, 7, caller, new address[](0), 0);
        m.onServiceTermination(7, caller);
        m.onOperatorJoined(7, op(1), 10_000);
        m.onOperatorLeft(7, op(1));
        m.onExitScheduled(7, op(1), 0);
        m.onExitCanceled(7, op(1));
        m.onUnappliedSlash(7, abi.encodePacked(op(1)), 10);
        m.onOperatorBinaryAcked(7, 1, op(1));
        m.onBinaryVersionPublished(1, TangleTypes.BinaryVersion(1, 0, false, bytes32(0), bytes32(0)), "uri");
        m.onAggregatedResult(7, JOIN, 1, "", 0, [uint256(0), 0], [uint256(0), 0, 0, 0]);
        vm.stopPrank();
        (bool d1,,,) = m.getExitConfig(7);
        (bool d2,) = m.getSlashingWindow(7);
        (bool d3,) = m.getHeartbeatThreshold(7);
        (bool d4,) = m.getNonPaymentTerminationPolicy(7);
        vm.assertTrue(d1 && d2 && d3 && d4);
        vm.assertFalse(m.forceRemoveAllowsBelowMin(7));
        (uint16 bps,) = m.getAggregationThreshold(7, JOIN);
        vm.assertEq(bps, 6700);
        (bool useDefault,) = m.getHeartbeatInterval(7);
        vm.assertTrue(useDefault);
        vm.assertTrue(m.canJoin(7, op(1)));
        vm.assertTrue(m.canLeave(7, op(1)));
        vm.assertEq(m.getRequiredResultCount(7, JOIN), 1);
        vm.assertFalse(m.requiresAggregation(7, JOIN));
        vm.assertEq(m.computeBillAdjustmentBps(7, 0, 1), 10_000);
        (, uint256 minStake) = m.getMinOperatorStake();
        vm.assertEq(minStake, MIN_STAKE);
        vm.assertEq(m.querySlashingOrigin(1), address(bsm));
        vm.assertEq(m.queryDisputeOrigin(1), address(bsm));
        vm.assertEq(m.queryDeveloperPaymentAddress(1), developer);
        vm.assertTrue(m.queryIsPaymentAssetAllowed(1, address(0)));
        vm.assertFalse(m.queryIsPaymentAssetAllowed(1, address(0xE20)));
    }

    function test_revert_NotCore() public {
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotCore.selector, staker, core));
        bsm.onRegister(staker, "");
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotCore.selector, staker, core));
        bsm.onSlash(0, abi.encodePacked(staker), 1);
    }

    function test_revert_NotCore_whenNoCoreSet() public {
        I.Params memory p = defaultParams();
        p.core = address(0);
        bsm = deployBSM(p);
        vm.prank(address(0));
        vm.expectRevert(abi.encodeWithSelector(I.NotCore.selector, address(0), address(0)));
        bsm.onUnregister(staker);
    }

    function test_revert_UnknownJobKind() public {
        address a = op(1);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.UnknownJobKind.selector, 9));
        tangle.submitResult(9, "");
        bytes memory call_ = signed(keyOf(1), 0, "");
        vm.expectRevert(abi.encodeWithSelector(I.UnknownJobKind.selector, 0));
        tangle.submitJob(0, call_);
    }

    /// `hookAction` runs only when the BSM calls itself from its hooks extension.
    function test_revert_OnlySelf() public {
        address a = op(1);
        register(a, MIN_STAKE);
        uint256 jobId = createJob(spec(2, 2, 1));
        vm.prank(core);
        vm.expectRevert(abi.encodeWithSelector(I.OnlySelf.selector, core));
        bsm.hookAction(JOIN, a, abi.encode(jobId));
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.OnlySelf.selector, a));
        bsm.hookAction(JOIN, a, abi.encode(jobId));
    }

    function test_revert_InvalidSlashPercent() public {
        vm.expectRevert(abi.encodeWithSelector(I.InvalidSlashPercent.selector, 51));
        tangle.slash(staker, 51);
    }

    function test_revert_InvalidOperatorSignature() public {
        address a = op(1);
        register(a, MIN_STAKE);
        uint256 jobId = createJob(spec(2, 2, 1));
        bytes memory args = abi.encode(jobId);
        // Signed by someone else.
        (, bytes memory wrongArgs, uint64 at, uint64 until, bytes memory sig) =
            abi.decode(signed(keyOf(2), JOIN, args), (address, bytes, uint64, uint64, bytes));
        vm.expectRevert(abi.encodeWithSelector(I.InvalidOperatorSignature.selector, a, 0));
        tangle.submitJob(JOIN, abi.encode(a, wrongArgs, at, until, sig));
        // Signed by the operator for another deadline than the one sent.
        (,,,, sig) = abi.decode(signed(keyOf(1), JOIN, args), (address, bytes, uint64, uint64, bytes));
        vm.expectRevert(abi.encodeWithSelector(I.InvalidOperatorSignature.selector, a, 0));
        tangle.submitJob(JOIN, abi.encode(a, args, at, until + 1, sig));
    }
}

/// Attack 4: the hooks trusted an `actor` from caller-supplied inputs, so any permitted caller
/// could act as any operator, e.g. force a victim into a job and collect its dropout slash.
/// Now identity is the core-vouched `operator` argument or the operator's EIP-712 signature.
contract HookActorSpoofingTest is HooksBase {
    function test_hookActorSpoofing_cannotActAsOperator() public {
        address victim = op(1);
        register(victim, MIN_STAKE);
        uint256 jobId = createJob(spec(2, 2, 1));
        // The old encoding: `abi.encode(actor, args)` naming the victim.
        vm.expectRevert();
        tangle.submitJob(JOIN, abi.encode(victim, abi.encode(jobId)));
        // A signature by the attacker over the victim's name.
        bytes memory forged = signed(keyOf(2), JOIN, abi.encode(jobId));
        (, bytes memory args, uint64 at, uint64 until, bytes memory sig) =
            abi.decode(forged, (address, bytes, uint64, uint64, bytes));
        vm.expectRevert(abi.encodeWithSelector(I.InvalidOperatorSignature.selector, victim, 0));
        tangle.submitJob(JOIN, abi.encode(victim, args, at, until, sig));
        // A result sent by the attacker acts as the attacker, never as the victim.
        address attacker = op(2);
        vm.prank(attacker);
        vm.expectRevert(abi.encodeWithSelector(I.NotRegistered.selector, attacker));
        tangle.submitResult(JOIN, abi.encode(jobId));
        vm.assertEq(uint8(bsm.getOperator(victim).activeJobs), 0, "victim forced into a job");
    }

    /// A signed call cannot be replayed: the nonce moves on.
    function test_hookActorSpoofing_noReplay() public {
        address a = op(1);
        register(a, MIN_STAKE);
        uint256 jobId = createJob(spec(2, 2, 1));
        bytes memory call_ = signed(keyOf(1), JOIN, abi.encode(jobId));
        tangle.submitJob(JOIN, call_);
        vm.prank(a);
        bsm.leaveJob(jobId);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidOperatorSignature.selector, a, 1));
        tangle.submitJob(JOIN, call_);
    }
}

/// Attack: an operator's signed JOIN reverted (the job was full), so its nonce stayed unused and
/// anyone could relay the same signature later, when a seat was free: the operator held a seat
/// it did not know of and was slashed as a dropout. A signed call now binds a deadline and the
/// job's epoch attempt, and the operator can cancel its nonce.
contract SignedCallReplayTest is HooksBase {
    function _fullJob() internal returns (uint256 jobId, address[] memory ops, address late) {
        ops = registerN(2);
        late = op(3);
        register(late, MIN_STAKE);
        jobId = createJob(spec(2, 2, 2));
        joinAll(jobId, ops); // running, attempt 1, full
    }

    function test_revert_SignedCallExpired() public {
        (uint256 jobId, address[] memory ops, address late) = _fullJob();
        bytes memory call_ = signed(keyOf(3), JOIN, abi.encode(jobId));
        vm.expectRevert(abi.encodeWithSelector(I.JobFull.selector, jobId, 2, 2));
        tangle.submitJob(JOIN, call_);
        vm.prank(ops[0]);
        bsm.leaveJob(jobId); // a seat frees at the boundary
        submitAll(jobId, keccak256("c"));
        finalize(jobId);
        vm.warp(block.timestamp + 2 hours);
        // Same attempt (the job waits Open for a member) and a free seat: only the deadline stops it.
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Open));
        (,,, uint64 deadline,) = abi.decode(call_, (address, bytes, uint64, uint64, bytes));
        vm.expectRevert(abi.encodeWithSelector(I.SignedCallExpired.selector, late, deadline, block.timestamp));
        tangle.submitJob(JOIN, call_);
        vm.assertEq(uint8(bsm.getOperator(late).activeJobs), 0, "seated by a replay");
    }

    function test_revert_SignedCallStale() public {
        (uint256 jobId, address[] memory ops, address late) = _fullJob();
        uint64 attempt = state(jobId).attempt;
        bytes memory call_ = signedFor(keyOf(3), JOIN, abi.encode(jobId), attempt, uint64(block.timestamp + 30 days));
        vm.expectRevert(abi.encodeWithSelector(I.JobFull.selector, jobId, 2, 2));
        tangle.submitJob(JOIN, call_);
        vm.prank(ops[0]);
        bsm.leaveJob(jobId);
        submitAll(jobId, keccak256("c"));
        finalize(jobId); // the job waits Open for a member: a fresh attempt voids older JOINs
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Open));
        // Attack: the JOIN that failed JobFull, replayed into the seat that just opened
        vm.expectRevert(abi.encodeWithSelector(I.SignedCallStale.selector, late, jobId, attempt, attempt + 1));
        tangle.submitJob(JOIN, call_);
        address other = op(4);
        register(other, MIN_STAKE);
        vm.prank(other);
        bsm.joinJob(jobId); // the next attempt starts
        vm.expectRevert(abi.encodeWithSelector(I.SignedCallStale.selector, late, jobId, attempt, attempt + 2));
        tangle.submitJob(JOIN, call_);
        vm.assertEq(uint8(bsm.getOperator(late).activeJobs), 0, "seated by a replay");
    }

    function test_cancelSignedCalls_voidsTheSignature() public {
        address a = op(1);
        register(a, MIN_STAKE);
        uint256 jobId = createJob(spec(2, 2, 1));
        bytes memory call_ = signed(keyOf(1), JOIN, abi.encode(jobId));
        vm.expectEmit();
        emit I.SignedCallsCancelled(a, 0);
        vm.prank(a);
        bsm.cancelSignedCalls();
        vm.assertEq(bsm.operatorNonce(a), 1);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidOperatorSignature.selector, a, 1));
        tangle.submitJob(JOIN, call_);
    }
}

/// Attack 4 (gas): finalizing through a hook exceeded the core's 500k cap at 12 members. Now a
/// hook settles `HOOK_SETTLE_BATCH` members per call and every call fits, at the 32-member cap.
contract HookGasCapTest is HooksBase {
    function test_hookGasCap_finalizeAtCapInPieces() public {
        address[] memory ops = registerN(32);
        for (uint256 i; i < 32; ++i) {
            vm.prank(staker);
            bsm.delegate{value: 1 ether}(ops[i]);
        }
        uint256 jobId = createJob(spec(32, 32, 2));
        for (uint256 i; i < 32; ++i) {
            vm.prank(ops[i]);
            tangle.submitResult(JOIN, abi.encode(jobId));
        }
        // Epoch 0: all paid; epoch 1: a third drop out and are slashed, then the job completes.
        submitAll(jobId, keccak256("c0"));
        uint256 calls = hookFinalize(jobId);
        vm.assertEq(state(jobId).epoch, 1);
        vm.assertEq(bsm.creditOf(ops[31]), PRICE * 40 / 100);
        address[] memory m = bsm.getMembers(jobId);
        address[] memory voters = new address[](m.length - m.length / 3);
        uint256 n;
        for (uint256 i; i < m.length; ++i) {
            if (i % 3 != 2) voters[n++] = m[i];
        }
        hookVote(jobId, voters, keccak256("c1"), fullParticipation(jobId));
        calls += hookFinalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        vm.assertLe(tangle.maxGas(), tangle.HOOK_GAS());
        emit log_named_uint("max gas of one hook call", tangle.maxGas());
        emit log_named_uint("finalize hook calls for 2 epochs", calls);
        vm.assertGe(calls, 2 * uint256(32) / 2); // HOOK_SETTLE_BATCH = 2 members per call
        assertConserved();
    }
}

/// The boundary that seats a running job's queue through the hooks, at the 32 cap: 30
/// queued for 29 free seats or for 30. A call seats at most 6 (drawn by stake among the 30),
/// the rest wait for later boundaries, and every call stays under the core's cap.
contract HookVacancyGasTest is HooksBase {
    function setUp() public override {
        super.setUp();
        bsm = deployBSM(seatDrawParams());
        tangle.setManager(address(bsm));
    }

    function _queuedAtCap(uint8 maxOps) internal returns (uint256 jobId) {
        address[] memory ops = registerN(32);
        jobId = createJob(spec(2, maxOps, 2));
        for (uint256 i; i < 32; ++i) {
            vm.prank(ops[i]);
            tangle.submitResult(JOIN, abi.encode(jobId));
            if (i == 1) {
                vm.warp(bsm.seatDrawAt(jobId));
                bsm.drawSeats(jobId);
                vm.roll(block.number + 2);
                bsm.drawSeats(jobId);
            }
        }
        vm.assertEq(bsm.getPendingJoins(jobId).length, 30);
        hookVote(jobId, bsm.getMembers(jobId), keccak256("c0"), fullParticipation(jobId));
        vm.roll(block.number + 2);
    }

    function test_hookGasCap_vacancyDrawAtCap() public {
        for (uint8 maxOps = 31; maxOps <= 32; ++maxOps) {
            uint256 snap = vm.snapshotState();
            uint256 jobId = _queuedAtCap(maxOps);
            hookFinalize(jobId);
            vm.assertEq(bsm.getMembers(jobId).length, 2 + 2, "two seated through the hooks");
            vm.assertEq(bsm.getPendingJoins(jobId).length, 28, "the others wait, queued");
            emit log_named_uint("max gas of one hook call (queue of 30 at a boundary)", tangle.maxGas());
            assertConserved();
            vm.revertToState(snap);
        }
    }
}

/// Without seat draws (a development chain) the hook's boundary seats the queue first come,
/// two a call like with draws: the rest wait for the next boundary, none forever.
contract HookQueueWithoutDrawsTest is HooksBase {
    function test_theQueueIsSeatedFirstComeAFewABoundary() public {
        address[] memory ops = registerN(5);
        uint256 jobId = createJob(spec(2, 5, 3));
        for (uint256 i; i < 5; ++i) {
            vm.prank(ops[i]);
            tangle.submitResult(JOIN, abi.encode(jobId));
        }
        vm.assertEq(bsm.getPendingJoins(jobId).length, 3);
        hookVote(jobId, bsm.getMembers(jobId), keccak256("c0"), fullParticipation(jobId));
        hookFinalize(jobId);
        address[] memory m = bsm.getMembers(jobId);
        vm.assertEq(m.length, 4, "two of the three queued seated");
        vm.assertEq(m[2], ops[2]);
        vm.assertEq(m[3], ops[3]);
        vm.assertEq(bsm.getPendingJoins(jobId).length, 1);
        hookVote(jobId, bsm.getMembers(jobId), keccak256("c1"), fullParticipation(jobId));
        hookFinalize(jobId);
        vm.assertEq(bsm.getMembers(jobId).length, 5, "the last one at the next boundary");
        vm.assertEq(bsm.getPendingJoins(jobId).length, 0);
        assertConserved();
    }
}

/// A running job cancelled by its caller and settled through the hooks in pieces, at the
/// 32-member cap: every call fits the core's gas cap and the refund is exact.
contract HookCancelTest is HooksBase {
    function _joinedThroughHooks(uint256 n) internal returns (uint256 jobId, address[] memory ops) {
        ops = registerN(n);
        for (uint256 i; i < n; ++i) {
            vm.prank(staker);
            bsm.delegate{value: 1 ether}(ops[i]);
        }
        jobId = createJob(spec(uint8(n), uint8(n), 3));
        for (uint256 i; i < n; ++i) {
            vm.prank(ops[i]);
            tangle.submitResult(JOIN, abi.encode(jobId));
        }
    }

    function test_cancelledAtCap_settlesInPiecesUnderTheCap() public {
        (uint256 jobId, address[] memory ops) = _joinedThroughHooks(32);
        vm.prank(caller);
        bsm.cancelJob(jobId);
        submitAll(jobId, keccak256("c0"));
        uint256 calls = hookFinalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Cancelled));
        vm.assertLe(tangle.maxGas(), tangle.HOOK_GAS());
        emit log_named_uint("max gas of one hook call (cancelled)", tangle.maxGas());
        vm.assertGe(calls, uint256(32) / 2);
        vm.assertEq(bsm.creditOf(caller), PRICE * 32 * 2, "two unearned epochs back");
        for (uint256 i; i < 32; ++i) {
            vm.assertEq(bsm.creditOf(ops[i]), PRICE * 40 / 100);
            vm.assertEq(bsm.bondedOf(ops[i]), 0);
        }
        assertConserved();
    }

    /// Once a hook has settled part of the epoch, a cancel waits for the epoch's end.
    function test_revert_SettlementInProgress() public {
        (uint256 jobId,) = _joinedThroughHooks(4);
        submitAll(jobId, keccak256("c0"));
        tangle.submitJob(FINALIZE, abi.encode(jobId, 0));
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.SettlementInProgress.selector, jobId, 0));
        bsm.cancelJob(jobId);
        hookFinalize(jobId);
        vm.assertEq(state(jobId).epoch, 1);
        vm.prank(caller);
        bsm.cancelJob(jobId);
        vm.assertTrue(bsm.cancelRequested(jobId));
    }
}
