// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IBSM} from "../utils/IBSM.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

contract ConstructorTest is BaseTest {
    function test_setsParams() public view {
        I.Params memory p = bsm.params();
        vm.assertEq(p.operatorBps, 4000);
        vm.assertEq(p.treasury, treasury);
        vm.assertEq(bsm.nextJobId(), 1);
    }

    /// EIP-170: a real chain (and anvil) refuses runtime code above 24,576 bytes.
    function test_runtimeFitsCodeSizeLimit() public view {
        vm.assertLe(address(bsm).code.length, 24_576, "runtime code size");
    }

    /// EIP-3860: a real chain refuses initcode above 49,152 bytes; the extensions are deployed
    /// apart, so the BSM's initcode is its runtime plus the constructor.
    function test_initcodeFitsLimit() public view {
        bytes memory code = vm.getCode("DistributedTrainingBSM.sol:DistributedTrainingBSM");
        vm.assertLe(code.length + abi.encode(defaultParams(), views).length, 49_152, "initcode size");
    }

    /// Every selector the BSM does not have reaches the extensions it was deployed with.
    function test_delegatesToItsExtensions() public {
        vm.assertEq(bsm.nextJobId(), 1); // views
        (bool ok, bytes memory ret) = address(bsm).staticcall(abi.encodeWithSignature("JOIN()"));
        vm.assertTrue(ok);
        vm.assertEq(abi.decode(ret, (uint8)), 1); // hooks, through views
        IBSM other = deployBSM(defaultParams());
        vm.assertEq(other.params().treasury, treasury); // one deployment serves both
    }

    function test_revert_ExtensionHasNoCode_views() public {
        address notAContract = makeAddr("views");
        bytes memory code = abi.encodePacked(
            vm.getCode("DistributedTrainingBSM.sol:DistributedTrainingBSM"), abi.encode(defaultParams(), notAContract)
        );
        vm.expectRevert(abi.encodeWithSelector(I.ExtensionHasNoCode.selector, notAContract));
        deployCode(code);
    }

    function test_revert_ExtensionHasNoCode_hooks() public {
        address notAContract = makeAddr("hooks");
        bytes memory code = abi.encodePacked(
            vm.getCode("DistributedTrainingBSMViews.sol:DistributedTrainingBSMViews"), abi.encode(notAContract)
        );
        vm.expectRevert(abi.encodeWithSelector(I.ExtensionHasNoCode.selector, notAContract));
        deployCode(code);
    }

    function test_revert_BpsSumNot10000() public {
        I.Params memory p = defaultParams();
        p.developerBps = 1999;
        vm.expectRevert(abi.encodeWithSelector(I.BpsSumNot10000.selector, 9999));
        deployBSM(p);
    }

    function test_revert_SlashBpsTooHigh() public {
        I.Params memory p = defaultParams();
        p.dropoutSlashBps = 5001;
        vm.expectRevert(abi.encodeWithSelector(I.SlashBpsTooHigh.selector, 5001, 5000));
        deployBSM(p);
    }

    function test_revert_BpsTooHigh() public {
        I.Params memory p = defaultParams();
        p.syncThresholdBps = 10001;
        vm.expectRevert(abi.encodeWithSelector(I.BpsTooHigh.selector, 10001));
        deployBSM(p);
    }

    function test_revert_InvalidMaxOperators() public {
        I.Params memory p = defaultParams();
        p.maxOperators = 33;
        vm.expectRevert(abi.encodeWithSelector(I.InvalidMaxOperators.selector, 33, 32));
        deployBSM(p);
    }

    function test_revert_ZeroAddress() public {
        I.Params memory p = defaultParams();
        p.treasury = address(0);
        vm.expectRevert(I.ZeroAddress.selector);
        deployBSM(p);
    }

    function test_revert_ZeroValue_minStake() public {
        I.Params memory p = defaultParams();
        p.minStake = 0;
        vm.expectRevert(I.ZeroValue.selector);
        deployBSM(p);
    }

    /// The unworkable compensation stays below what training pays the operator.
    function test_revert_InvalidUnworkableComp() public {
        I.Params memory p = defaultParams();
        p.unworkableCompBps = p.operatorBps;
        vm.expectRevert(abi.encodeWithSelector(I.InvalidUnworkableComp.selector, p.operatorBps, p.operatorBps));
        deployBSM(p);
    }

    function test_revert_UnbondingTooShort_revealWindow() public {
        I.Params memory p = defaultParams();
        p.revealWindow = UNBONDING / 4 - GRACE - MIN_EPOCH + 1;
        vm.expectRevert(abi.encodeWithSelector(I.UnbondingTooShort.selector, UNBONDING, UNBONDING + 4));
        deployBSM(p);
    }

    function testFuzz_feeBps(uint16 a, uint16 b, uint16 c) public {
        a = uint16(bound(a, 0, 10000));
        b = uint16(bound(b, 0, 10000 - a));
        c = uint16(bound(c, 0, 10000 - a - b));
        I.Params memory p = defaultParams();
        (p.operatorBps, p.stakerBps, p.protocolBps, p.developerBps) = (a, b, c, 10000 - a - b - c);
        p.unworkableCompBps = 0;
        IBSM d = deployBSM(p);
        vm.assertEq(d.params().developerBps, 10000 - a - b - c);
    }
}

contract RegisterOperatorTest is BaseTest {
    function test_registersWithStake() public {
        address a = op(1);
        vm.deal(a, 2 ether);
        vm.expectEmit();
        emit I.OperatorRegistered(a, peerKeyOf(a), 2 ether);
        vm.prank(a);
        bsm.registerOperator{value: 2 ether}(peerKeyOf(a), addrsOf(1), "gpu:a100", 0.05 ether);
        I.OperatorInfo memory o = bsm.getOperator(a);
        vm.assertTrue(o.registered);
        vm.assertEq(o.peerKey, peerKeyOf(a));
        vm.assertEq(o.multiaddrs[0], "/ip4/127.0.0.1/tcp/40001");
        vm.assertEq(o.hardware, "gpu:a100");
        vm.assertEq(o.minPricePerEpoch, 0.05 ether);
        vm.assertEq(bsm.stakeOf(a, a), 2 ether);
        vm.assertEq(bsm.sharesOf(a, a), 2 ether);
        assertConserved();
    }

    function test_revert_StakeBelowMinimum() public {
        address a = op(1);
        vm.deal(a, 1 ether);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.StakeBelowMinimum.selector, 0.5 ether, MIN_STAKE));
        bsm.registerOperator{value: 0.5 ether}(peerKeyOf(a), addrsOf(1), "", 0);
    }

    function test_revert_AlreadyRegistered() public {
        address a = op(1);
        register(a, MIN_STAKE);
        vm.deal(a, 1 ether);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.AlreadyRegistered.selector, a));
        bsm.registerOperator{value: 1 ether}(peerKeyOf(a), addrsOf(1), "", 0);
    }

    function testFuzz_register(uint256 amount) public {
        amount = bound(amount, MIN_STAKE, 1e30);
        address a = op(7);
        register(a, amount);
        vm.assertEq(bsm.stakeOf(a, a), amount);
        assertConserved();
    }
}

contract UpdateOperatorTest is BaseTest {
    function test_updates() public {
        address a = op(1);
        register(a, MIN_STAKE);
        string[] memory m = new string[](2);
        m[0] = "/ip4/10.0.0.1/tcp/1";
        m[1] = "/ip6/::1/tcp/2";
        vm.prank(a);
        bsm.updateOperator(bytes32(uint256(1)), m, "cpu:64", 7);
        I.OperatorInfo memory o = bsm.getOperator(a);
        vm.assertEq(o.peerKey, bytes32(uint256(1)));
        vm.assertEq(o.multiaddrs.length, 2);
        vm.assertEq(o.multiaddrs[1], "/ip6/::1/tcp/2");
        vm.assertEq(o.minPricePerEpoch, 7);
    }

    function test_revert_NotRegistered() public {
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotRegistered.selector, staker));
        bsm.updateOperator(bytes32(uint256(1)), new string[](0), "", 0);
    }
}

contract DeregisterOperatorTest is BaseTest {
    function test_queuesAllStake() public {
        address a = op(1);
        register(a, 3 ether);
        vm.prank(a);
        bsm.deregisterOperator();
        vm.assertFalse(bsm.getOperator(a).registered);
        vm.assertEq(bsm.stakeOf(a, a), 0);
        (uint256 amount, uint64 unlockAt) = bsm.unbondingOf(a, a);
        vm.assertEq(amount, 3 ether);
        vm.assertEq(unlockAt, block.timestamp + UNBONDING);
        assertConserved();
    }

    function test_revert_OperatorHasActiveJobs() public {
        (, address[] memory ops) = runningJob(2, 1);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.OperatorHasActiveJobs.selector, ops[0], 1));
        bsm.deregisterOperator();
    }

    function test_revert_NotRegistered() public {
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotRegistered.selector, staker));
        bsm.deregisterOperator();
    }
}
