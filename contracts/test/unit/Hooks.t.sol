// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";
import {IBlueprintServiceManager} from "../../src/interfaces/IBlueprintServiceManager.sol";
import {IBSM} from "../utils/IBSM.sol";

/// Plays the Tangle core and drives a whole job through the hooks.
contract HooksTest is BaseTest {
    uint8 internal constant SUBMIT_JOB = 0;
    uint8 internal constant JOIN = 1;
    uint8 internal constant LEAVE = 2;
    uint8 internal constant SUBMIT_CHECKPOINT = 3;
    uint8 internal constant FINALIZE = 4;

    function coreRegister(address a) internal {
        vm.deal(core, core.balance + MIN_STAKE);
        vm.prank(core);
        bsm.onRegister{value: MIN_STAKE}(a, abi.encode(peerKeyOf(a), addrsOf(1), "cpu:2", uint256(0)));
    }

    function test_wholeJobThroughHooks() public {
        address[] memory ops = new address[](3);
        for (uint256 i; i < 3; ++i) {
            ops[i] = op(i + 1);
            coreRegister(ops[i]);
            vm.assertTrue(bsm.getOperator(ops[i]).registered);
        }
        // Request creates the job and joins the first two listed operators.
        I.JobSpec memory s = spec(3, 3, 1);
        address[] memory first = new address[](2);
        (first[0], first[1]) = (ops[0], ops[1]);
        vm.deal(core, escrowOf(s));
        vm.prank(core);
        bsm.onRequest{value: escrowOf(s)}(9, caller, first, abi.encode(s), 0, address(0), escrowOf(s));
        uint256 jobId = 1;
        vm.assertEq(bsm.getMembers(jobId).length, 2);
        // The third joins through a job call.
        vm.prank(core);
        bsm.onJobCall(0, JOIN, 1, abi.encode(ops[2], abi.encode(jobId)));
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Running));
        // Checkpoints arrive as job results.
        uint32[] memory p = fullParticipation(jobId);
        address[] memory m = bsm.getMembers(jobId);
        for (uint256 i; i < 3; ++i) {
            vm.prank(core);
            bsm.onJobResult(0, SUBMIT_CHECKPOINT, 2, m[i], bytes32(0), abi.encode(jobId, uint256(0), keccak256("w"), p));
        }
        vm.prank(core);
        bsm.onJobCall(0, FINALIZE, 3, abi.encode(reporter, abi.encode(jobId, uint256(0))));
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        vm.assertEq(state(jobId).checkpoint, keccak256("w"));
        vm.assertEq(bsm.creditOf(m[0]), PRICE * 40 / 100);
        vm.assertEq(bsm.creditOf(developer), 3 * PRICE * 20 / 100);
        // Unregister through the core: stake starts unbonding.
        vm.prank(core);
        bsm.onUnregister(ops[0]);
        vm.assertFalse(bsm.getOperator(ops[0]).registered);
        assertConserved();
    }

    function test_submitJobThroughJobCall() public {
        I.JobSpec memory s = spec(1, 2, 1);
        vm.deal(core, escrowOf(s));
        vm.prank(core);
        bsm.onJobCall{value: escrowOf(s)}(0, SUBMIT_JOB, 1, abi.encode(caller, abi.encode(s)));
        vm.assertEq(state(1).caller, caller);
        vm.assertEq(state(1).escrow, escrowOf(s));
    }

    function test_leaveThroughJobResult() public {
        address a = op(1);
        coreRegister(a);
        uint256 jobId = createJob(spec(2, 2, 1));
        vm.prank(core);
        bsm.onJobResult(0, JOIN, 1, a, bytes32(0), abi.encode(jobId));
        vm.prank(core);
        bsm.onJobResult(0, LEAVE, 2, a, bytes32(0), abi.encode(jobId));
        vm.assertEq(bsm.getPendingJoins(jobId).length, 0);
    }

    function test_onSlashSlashesPool() public {
        address a = op(1);
        coreRegister(a);
        vm.prank(staker);
        bsm.delegate{value: 1 ether}(a);
        vm.prank(core);
        bsm.onSlash(0, abi.encode(a), 20);
        vm.assertEq(bsm.stakeOf(a, staker), 0.8 ether);
        vm.assertEq(bsm.creditOf(treasury), 0.4 ether);
        assertConserved();
    }

    function test_queries() public view {
        vm.assertEq(bsm.querySlashingOrigin(1), address(bsm));
        vm.assertEq(bsm.queryDeveloperPaymentAddress(1), developer);
        vm.assertTrue(bsm.queryIsPaymentAssetAllowed(1, address(0)));
        vm.assertFalse(bsm.queryIsPaymentAssetAllowed(1, address(0xE20)));
    }

    function test_revert_NotCore() public {
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotCore.selector, staker, core));
        bsm.onRegister(staker, "");
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotCore.selector, staker, core));
        bsm.onSlash(0, abi.encode(staker), 1);
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
        vm.prank(core);
        vm.expectRevert(abi.encodeWithSelector(I.UnknownJobKind.selector, 9));
        bsm.onJobCall(0, 9, 1, abi.encode(staker, bytes("")));
        vm.prank(core);
        vm.expectRevert(abi.encodeWithSelector(I.UnknownJobKind.selector, FINALIZE));
        bsm.onJobResult(0, FINALIZE, 1, staker, bytes32(0), "");
    }

    function test_revert_UnsupportedPaymentAsset() public {
        vm.prank(core);
        vm.expectRevert(abi.encodeWithSelector(I.UnsupportedPaymentAsset.selector, address(0xE20)));
        bsm.onRequest(1, caller, new address[](0), "", 0, address(0xE20), 1);
    }

    function test_revert_PaymentMismatch() public {
        vm.deal(core, 1 ether);
        vm.prank(core);
        vm.expectRevert(abi.encodeWithSelector(I.PaymentMismatch.selector, 2 ether, 1 ether));
        bsm.onRequest{value: 1 ether}(1, caller, new address[](0), "", 0, address(0), 2 ether);
        vm.prank(core);
        vm.expectRevert(abi.encodeWithSelector(I.PaymentMismatch.selector, 0, 1 ether));
        bsm.onJobCall{value: 1 ether}(0, JOIN, 1, abi.encode(staker, abi.encode(uint256(1))));
    }

    function test_revert_InvalidSlashPercent() public {
        vm.prank(core);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidSlashPercent.selector, 51));
        bsm.onSlash(0, abi.encode(staker), 51);
    }
}
