// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IBSM} from "../utils/IBSM.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

contract StakeTest is BaseTest {
    function test_addsStake() public {
        address a = op(1);
        register(a, MIN_STAKE);
        vm.deal(a, 1 ether);
        vm.prank(a);
        bsm.stake{value: 1 ether}();
        vm.assertEq(bsm.stakeOf(a, a), 2 ether);
        assertConserved();
    }

    function test_revert_ZeroValue() public {
        address a = op(1);
        register(a, MIN_STAKE);
        vm.prank(a);
        vm.expectRevert(I.ZeroValue.selector);
        bsm.stake();
    }

    function test_revert_NotRegistered() public {
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotRegistered.selector, staker));
        bsm.stake{value: 1}();
    }
}

contract UnstakeTest is BaseTest {
    function test_queuesAboveMinimum() public {
        address a = op(1);
        register(a, 3 ether);
        vm.prank(a);
        bsm.unstake(2 ether);
        vm.assertEq(bsm.stakeOf(a, a), 1 ether);
        (uint256 amount,) = bsm.unbondingOf(a, a);
        vm.assertEq(amount, 2 ether);
        assertConserved();
    }

    function test_revert_StakeBelowMinimum() public {
        address a = op(1);
        register(a, 3 ether);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.StakeBelowMinimum.selector, 0.5 ether, MIN_STAKE));
        bsm.unstake(2.5 ether);
    }

    function test_revert_InsufficientStake() public {
        address a = op(1);
        register(a, 3 ether);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.InsufficientStake.selector, 4 ether, 3 ether));
        bsm.unstake(4 ether);
    }

    function test_revert_ZeroValue() public {
        address a = op(1);
        register(a, 3 ether);
        vm.prank(a);
        vm.expectRevert(I.ZeroValue.selector);
        bsm.unstake(0);
    }

    function test_revert_NotRegistered() public {
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotRegistered.selector, staker));
        bsm.unstake(1);
    }
}

contract DelegateTest is BaseTest {
    function test_mintsShares() public {
        address a = op(1);
        register(a, MIN_STAKE);
        vm.expectEmit();
        emit I.Staked(a, staker, 5 ether, 5 ether);
        vm.prank(staker);
        bsm.delegate{value: 5 ether}(a);
        vm.assertEq(bsm.stakeOf(a, staker), 5 ether);
        vm.assertEq(bsm.getPool(a).totalAssets, 6 ether);
        assertConserved();
    }

    function test_afterSlashGetsMoreShares() public {
        (uint256 jobId, address[] memory ops) = runningJob(3, 2);
        vm.warp(block.timestamp + GRACE + EPOCH + 1);
        finalize(jobId); // all three dropped out: 5% slashed each
        uint256 before = bsm.getPool(ops[0]).totalShares;
        vm.prank(staker);
        bsm.delegate{value: 0.95 ether}(ops[0]);
        vm.assertEq(bsm.getPool(ops[0]).totalShares - before, 1 ether);
        vm.assertEq(bsm.stakeOf(ops[0], staker), 0.95 ether);
        assertConserved();
    }

    function test_revert_NotRegistered() public {
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NotRegistered.selector, op(9)));
        bsm.delegate{value: 1}(op(9));
    }

    function test_revert_ZeroValue() public {
        address a = op(1);
        register(a, MIN_STAKE);
        vm.prank(staker);
        vm.expectRevert(I.ZeroValue.selector);
        bsm.delegate(a);
    }
}

contract UndelegateTest is BaseTest {
    address internal a;

    function setUp() public override {
        super.setUp();
        a = op(1);
        register(a, MIN_STAKE);
        vm.prank(staker);
        bsm.delegate{value: 4 ether}(a);
    }

    function test_queues() public {
        vm.expectEmit();
        emit I.UnbondingQueued(a, staker, 1 ether, uint64(block.timestamp + UNBONDING));
        vm.prank(staker);
        bsm.undelegate(a, 1 ether);
        vm.assertEq(bsm.stakeOf(a, staker), 3 ether);
        (uint256 amount,) = bsm.unbondingOf(a, staker);
        vm.assertEq(amount, 1 ether);
        assertConserved();
    }

    function test_operatorSelfUndelegateKeepsMinimum() public {
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.StakeBelowMinimum.selector, 0, MIN_STAKE));
        bsm.undelegate(a, MIN_STAKE);
    }

    function test_revert_InsufficientStake() public {
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.InsufficientStake.selector, 5 ether, 4 ether));
        bsm.undelegate(a, 5 ether);
    }

    function test_revert_ZeroValue() public {
        vm.prank(staker);
        vm.expectRevert(I.ZeroValue.selector);
        bsm.undelegate(a, 0);
    }

    function testFuzz_undelegate(uint256 amount) public {
        amount = bound(amount, 1, 4 ether);
        vm.prank(staker);
        bsm.undelegate(a, amount);
        (uint256 queued,) = bsm.unbondingOf(a, staker);
        vm.assertEq(queued, amount);
        vm.assertGe(bsm.stakeOf(a, staker) + 1, 4 ether - amount, "stake rounding beyond 1 wei");
        assertConserved();
    }
}

contract WithdrawUnbondedTest is BaseTest {
    address internal a;

    function setUp() public override {
        super.setUp();
        a = op(1);
        register(a, MIN_STAKE);
        vm.prank(staker);
        bsm.delegate{value: 4 ether}(a);
        vm.prank(staker);
        bsm.undelegate(a, 4 ether);
    }

    function test_creditsAfterUnlock() public {
        vm.warp(block.timestamp + UNBONDING);
        vm.prank(staker);
        bsm.withdrawUnbonded(a);
        vm.assertEq(bsm.creditOf(staker), 4 ether);
        assertConserved();
    }

    function test_unbondingStakeIsSlashed() public {
        // The operator's pool is slashed while the delegation is unbonding.
        vm.prank(core);
        bsm.onSlash(0, abi.encode(a), 10);
        (uint256 amount,) = bsm.unbondingOf(a, staker);
        vm.assertEq(amount, 3.6 ether);
        vm.warp(block.timestamp + UNBONDING);
        vm.prank(staker);
        bsm.withdrawUnbonded(a);
        vm.assertEq(bsm.creditOf(staker), 3.6 ether);
        assertConserved();
    }

    function test_revert_StillUnbonding() public {
        uint256 unlockAt = block.timestamp + UNBONDING;
        vm.warp(unlockAt - 1);
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.StillUnbonding.selector, unlockAt, unlockAt - 1));
        bsm.withdrawUnbonded(a);
    }

    function test_revert_NothingUnbonding() public {
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.NothingUnbonding.selector, a, caller));
        bsm.withdrawUnbonded(a);
    }

    function testFuzz_unbondingTiming(uint256 dt) public {
        dt = bound(dt, 0, 2 * UNBONDING);
        vm.warp(block.timestamp + dt);
        if (dt < UNBONDING) vm.expectRevert();
        vm.prank(staker);
        bsm.withdrawUnbonded(a);
    }
}

contract ClaimRewardsTest is BaseTest {
    function test_stakersSharePoolReward() public {
        address[] memory ops = registerN(2);
        vm.prank(staker);
        bsm.delegate{value: 3 ether}(ops[0]); // pool: 1 ether self + 3 ether delegated
        uint256 jobId = createJob(spec(2, 2, 2));
        joinAll(jobId, ops);
        submitAll(jobId, keccak256("ckpt0"));
        finalize(jobId);
        uint256 pool = PRICE * 2000 / 10000;
        vm.assertEq(bsm.pendingRewards(ops[0], staker), pool * 3 / 4);
        vm.prank(staker);
        bsm.claimRewards(ops[0]);
        vm.assertEq(bsm.creditOf(staker), pool * 3 / 4);
        vm.assertEq(bsm.pendingRewards(ops[0], staker), 0);
        vm.prank(ops[0]);
        bsm.claimRewards(ops[0]);
        vm.assertEq(bsm.creditOf(ops[0]), PRICE * 4000 / 10000 + pool / 4);
        assertConserved();
    }

    function test_claimWithNothingIsNoop() public {
        address a = op(1);
        register(a, MIN_STAKE);
        vm.prank(staker);
        bsm.claimRewards(a);
        vm.assertEq(bsm.creditOf(staker), 0);
    }
}

contract WithdrawTest is BaseTest {
    function test_paysCredits() public {
        address a = op(1);
        register(a, MIN_STAKE);
        vm.prank(core);
        bsm.onSlash(0, abi.encode(a), 50); // credits the treasury
        uint256 credit = bsm.creditOf(treasury);
        vm.assertEq(credit, 0.5 ether);
        uint256 before = treasury.balance;
        vm.prank(treasury);
        bsm.withdraw();
        vm.assertEq(treasury.balance - before, credit);
        vm.assertEq(bsm.creditOf(treasury), 0);
        assertConserved();
    }

    function test_revert_NothingToWithdraw() public {
        vm.prank(staker);
        vm.expectRevert(abi.encodeWithSelector(I.NothingToWithdraw.selector, staker));
        bsm.withdraw();
    }

    function test_revert_TransferFailed() public {
        Rejector r = new Rejector();
        // The rejector is the treasury, so a core slash credits it.
        I.Params memory p = defaultParams();
        p.treasury = address(r);
        bsm = deployBSM(p);
        address a = op(1);
        register(a, MIN_STAKE);
        vm.prank(core);
        bsm.onSlash(0, abi.encode(a), 10);
        vm.prank(address(r));
        vm.expectRevert(abi.encodeWithSelector(I.TransferFailed.selector, address(r), 0.1 ether));
        bsm.withdraw();
    }

    function test_reentrancyBlocked() public {
        Reenterer r = new Reenterer(bsm);
        I.Params memory p = defaultParams();
        p.treasury = address(r);
        bsm = deployBSM(p);
        r.setTarget(bsm);
        address a = op(1);
        register(a, MIN_STAKE);
        vm.prank(core);
        bsm.onSlash(0, abi.encode(a), 10);
        // The nested withdraw reverts, so the outer transfer fails as a whole.
        vm.prank(address(r));
        vm.expectRevert(abi.encodeWithSelector(I.TransferFailed.selector, address(r), 0.1 ether));
        bsm.withdraw();
        vm.assertEq(bsm.creditOf(address(r)), 0.1 ether);
    }
}

contract Rejector {
    receive() external payable {
        revert("no");
    }
}

contract Reenterer {
    IBSM internal target;

    constructor(IBSM t) {
        target = t;
    }

    function setTarget(IBSM t) external {
        target = t;
    }

    receive() external payable {
        target.withdraw();
    }
}
