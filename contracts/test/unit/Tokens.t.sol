// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";
import {TestUSD} from "../../src/devnet/TestUSD.sol";
import {DecimalsToken, MintableToken, FeeOnTransferToken, LyingToken, ReentrantToken} from "../utils/BadTokens.sol";
import {HooksBase} from "./Hooks.t.sol";

interface IERC20Errors {
    error ERC20InsufficientAllowance(address spender, uint256 allowance, uint256 needed);
}

interface IReentrancy {
    error ReentrancyGuardReentrantCall();
}

/// Jobs priced in an ERC-20 token: a gateway pays the escrow, the owner is the job's caller.
abstract contract TokenBase is BaseTest {
    TestUSD internal usd;
    address internal gateway = makeAddr("gateway");
    address internal owner = makeAddr("owner");
    uint256 internal constant TPRICE = 2_000_000; // 2 TUSD per operator-epoch

    function setUp() public virtual override {
        super.setUp();
        usd = new TestUSD();
        allow(address(usd));
        usd.mint(gateway, 1_000_000e6);
    }

    function allow(address token) internal {
        vm.prank(developer);
        bsm.setPaymentToken(token, true);
    }

    function tspec(uint8 minOps, uint8 maxOps, uint32 epochs) internal pure returns (I.JobSpec memory s) {
        s = spec(minOps, maxOps, epochs);
        s.pricePerOperatorEpoch = TPRICE;
    }

    function createTokenJob(I.JobSpec memory s, address token) internal returns (uint256 jobId) {
        MintableToken(token).mint(gateway, escrowOf(s));
        vm.startPrank(gateway);
        MintableToken(token).approve(address(bsm), escrowOf(s));
        jobId = bsm.createJobWithToken(s, token, owner);
        vm.stopPrank();
    }

    function runningTokenJob(uint256 n, uint32 epochs) internal returns (uint256 jobId, address[] memory ops) {
        ops = registerN(n);
        jobId = createTokenJob(tspec(uint8(n), uint8(n), epochs), address(usd));
        joinAll(jobId, ops);
    }

    function credit(address a) internal view returns (uint256) {
        return bsm.tokenCreditOf(address(usd), a);
    }

    /// The BSM's balance of `token` is exactly what it owes in it.
    function assertTokenConserved(address token) internal view {
        (uint256 e, uint256 c, uint256 r) = bsm.tokenAccounting(token);
        vm.assertEq(MintableToken(token).balanceOf(address(bsm)), e + c + r, "token balance != accounted");
    }
}

contract SetPaymentTokenTest is TokenBase {
    function test_allowsListsAndDisallows() public {
        MintableToken t = new MintableToken("T2");
        vm.expectEmit();
        emit I.PaymentTokenSet(address(t), true);
        allow(address(t));
        vm.assertTrue(bsm.isPaymentToken(address(t)));
        address[] memory list = bsm.paymentTokens();
        vm.assertEq(list.length, 2);
        vm.assertEq(list[1], address(t));
        vm.prank(developer);
        bsm.setPaymentToken(address(t), false);
        vm.assertFalse(bsm.isPaymentToken(address(t)));
        // Allowing it again reuses its slot.
        allow(address(t));
        vm.assertEq(bsm.paymentTokens().length, 2);
    }

    /// A disallowed token takes no new jobs; a job already escrowed in it runs on and pays out.
    function test_disallowedTokenJobRunsOn() public {
        (uint256 jobId, address[] memory ops) = runningTokenJob(2, 1);
        vm.prank(developer);
        bsm.setPaymentToken(address(usd), false);
        submitAll(jobId, keccak256("c"));
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        vm.prank(ops[0]);
        bsm.withdrawToken(address(usd));
        vm.assertEq(usd.balanceOf(ops[0]), TPRICE * 4000 / 10_000);
        I.JobSpec memory s = tspec(2, 2, 1);
        vm.prank(gateway);
        vm.expectRevert(abi.encodeWithSelector(I.TokenNotAllowed.selector, address(usd)));
        bsm.createJobWithToken(s, address(usd), owner);
    }

    function test_revert_NotDeveloper() public {
        MintableToken t = new MintableToken("T2");
        for (uint256 i; i < 3; ++i) {
            address stranger = [caller, treasury, gateway][i];
            vm.prank(stranger);
            vm.expectRevert(abi.encodeWithSelector(I.NotDeveloper.selector, stranger, developer));
            bsm.setPaymentToken(address(t), true);
        }
    }

    function test_revert_NotAToken() public {
        vm.prank(developer);
        vm.expectRevert(abi.encodeWithSelector(I.NotAToken.selector, address(0xBEEF)));
        bsm.setPaymentToken(address(0xBEEF), true);
    }

    function test_revert_TooManyPaymentTokens() public {
        for (uint256 i; i < 3; ++i) {
            allow(address(new MintableToken("T")));
        }
        MintableToken fifth = new MintableToken("T5");
        vm.prank(developer);
        vm.expectRevert(abi.encodeWithSelector(I.TooManyPaymentTokens.selector, 4, 4));
        bsm.setPaymentToken(address(fifth), true);
        // Disallowing one frees no slot: the bound is on tokens ever allowed.
        vm.prank(developer);
        bsm.setPaymentToken(address(usd), false);
        vm.prank(developer);
        vm.expectRevert(abi.encodeWithSelector(I.TooManyPaymentTokens.selector, 4, 4));
        bsm.setPaymentToken(address(fifth), true);
    }
}

contract CreateJobWithTokenTest is TokenBase {
    function test_gatewayPaysOwnerOwns() public {
        I.JobSpec memory s = tspec(2, 4, 3);
        uint256 escrow = escrowOf(s);
        vm.startPrank(gateway);
        usd.approve(address(bsm), escrow);
        vm.expectEmit();
        emit I.JobCreated(1, owner, I.Method.CPT, escrow);
        vm.expectEmit();
        emit I.JobEscrowedInToken(1, address(usd), gateway, escrow);
        uint256 jobId = bsm.createJobWithToken(s, address(usd), owner);
        vm.stopPrank();
        vm.assertEq(state(jobId).caller, owner);
        vm.assertEq(state(jobId).escrow, escrow);
        vm.assertEq(bsm.jobToken(jobId), address(usd));
        vm.assertEq(usd.balanceOf(address(bsm)), escrow);
        (uint256 e,,) = bsm.tokenAccounting(address(usd));
        vm.assertEq(e, escrow);
        // No ether moved: the ether books are untouched.
        (,, uint256 ethEscrow,,) = bsm.accounting();
        vm.assertEq(ethEscrow, 0);
        vm.assertEq(bsm.jobToken(createJob(spec(2, 4, 3))), address(0));
        assertTokenConserved(address(usd));
        assertConserved();
    }

    function test_revert_TokenNotAllowed() public {
        MintableToken t = new MintableToken("T2");
        t.mint(gateway, 1e12);
        I.JobSpec memory s = tspec(2, 4, 3);
        vm.startPrank(gateway);
        t.approve(address(bsm), escrowOf(s));
        vm.expectRevert(abi.encodeWithSelector(I.TokenNotAllowed.selector, address(t)));
        bsm.createJobWithToken(s, address(t), owner);
        // address(0) is ether, which has its own entry point.
        vm.expectRevert(abi.encodeWithSelector(I.TokenNotAllowed.selector, address(0)));
        bsm.createJobWithToken(s, address(0), owner);
        vm.stopPrank();
    }

    function test_revert_ZeroOwner() public {
        I.JobSpec memory s = tspec(2, 4, 3);
        vm.startPrank(gateway);
        usd.approve(address(bsm), escrowOf(s));
        vm.expectRevert(I.ZeroOwner.selector);
        bsm.createJobWithToken(s, address(usd), address(0));
        vm.stopPrank();
    }

    function test_revert_ZeroValue() public {
        I.JobSpec memory s = tspec(2, 4, 3);
        s.pricePerOperatorEpoch = 0;
        vm.prank(gateway);
        vm.expectRevert(I.ZeroValue.selector);
        bsm.createJobWithToken(s, address(usd), owner);
    }

    function test_revert_InvalidOperatorRange() public {
        I.JobSpec memory s = tspec(3, 2, 3);
        vm.prank(gateway);
        vm.expectRevert(abi.encodeWithSelector(I.InvalidOperatorRange.selector, 3, 2, 32));
        bsm.createJobWithToken(s, address(usd), owner);
    }

    /// A payer without allowance cannot draw on the escrow other jobs hold in the BSM.
    function test_revert_cannotUseOtherJobsEscrow() public {
        createTokenJob(tspec(2, 4, 3), address(usd));
        address stranger = makeAddr("stranger");
        I.JobSpec memory s = tspec(2, 4, 3);
        vm.prank(stranger);
        vm.expectRevert(
            abi.encodeWithSelector(IERC20Errors.ERC20InsufficientAllowance.selector, address(bsm), 0, escrowOf(s))
        );
        bsm.createJobWithToken(s, address(usd), stranger);
    }

    function test_revert_WrongEscrow_feeOnTransfer() public {
        FeeOnTransferToken t = new FeeOnTransferToken();
        allow(address(t));
        t.mint(gateway, 1e12);
        I.JobSpec memory s = tspec(2, 4, 3);
        uint256 escrow = escrowOf(s);
        vm.startPrank(gateway);
        t.approve(address(bsm), escrow);
        vm.expectRevert(abi.encodeWithSelector(I.WrongEscrow.selector, escrow, escrow - escrow / 100));
        bsm.createJobWithToken(s, address(t), owner);
        vm.stopPrank();
    }

    /// A token that reports a transfer it did not make: the BSM already holds enough of it
    /// (another job's escrow), but only its balance growth counts.
    function test_revert_WrongEscrow_lyingToken() public {
        LyingToken t = new LyingToken();
        allow(address(t));
        t.mint(address(bsm), 1e12);
        I.JobSpec memory s = tspec(2, 4, 3);
        vm.prank(gateway);
        vm.expectRevert(abi.encodeWithSelector(I.WrongEscrow.selector, escrowOf(s), 0));
        bsm.createJobWithToken(s, address(t), owner);
    }

    /// A token calling back into the BSM while it pulls the escrow finds the lock taken.
    function test_revert_reentrantTokenIsLocked() public {
        ReentrantToken t = new ReentrantToken();
        allow(address(t));
        t.mint(gateway, 1e12);
        I.JobSpec memory s = tspec(2, 4, 3);
        t.arm(address(bsm), abi.encodeCall(bsm.createJobWithToken, (s, address(t), owner)));
        vm.startPrank(gateway);
        t.approve(address(bsm), 10 * escrowOf(s));
        uint256 jobId = bsm.createJobWithToken(s, address(t), owner);
        vm.stopPrank();
        vm.assertTrue(t.reentered());
        vm.assertEq(t.result(), abi.encodeWithSelector(IReentrancy.ReentrancyGuardReentrantCall.selector));
        vm.assertEq(jobId, 1);
        vm.assertEq(bsm.nextJobId(), 2);
        assertTokenConserved(address(t));
    }

    function testFuzz_escrowIsPriceTimesSeatsTimesEpochs(uint64 price, uint8 maxOps, uint8 epochs) public {
        maxOps = uint8(bound(maxOps, 2, 32));
        epochs = uint8(bound(epochs, 1, 20));
        price = uint64(bound(price, 1, 1e12));
        I.JobSpec memory s = tspec(2, maxOps, epochs);
        s.pricePerOperatorEpoch = price;
        uint256 jobId = createTokenJob(s, address(usd));
        vm.assertEq(state(jobId).escrow, uint256(price) * maxOps * epochs);
        vm.assertEq(usd.balanceOf(address(bsm)), uint256(price) * maxOps * epochs);
        assertTokenConserved(address(usd));
    }
}

/// Everything money-related of a token job happens in its token; stake and slashing in ether.
contract TokenSettlementTest is TokenBase {
    function test_paidEpochSplitsInToken() public {
        address[] memory ops = registerN(2);
        vm.prank(staker);
        bsm.delegate{value: 1 ether}(ops[0]);
        uint256 jobId = createTokenJob(tspec(2, 2, 2), address(usd));
        joinAll(jobId, ops);
        uint256 devBefore = bsm.creditOf(developer);
        submitAll(jobId, keccak256("c"));
        finalize(jobId);
        vm.assertEq(credit(ops[0]), TPRICE * 4000 / 10_000);
        vm.assertEq(credit(ops[1]), TPRICE * 4000 / 10_000);
        vm.assertEq(credit(developer), 2 * TPRICE * 2000 / 10_000);
        // Each pool's 20% goes to its shares (the delegation was made before the job).
        uint256 pending = bsm.pendingTokenRewards(address(usd), ops[0], staker)
            + bsm.pendingTokenRewards(address(usd), ops[0], ops[0])
            + bsm.pendingTokenRewards(address(usd), ops[1], ops[1]);
        vm.assertApproxEqAbs(pending, 2 * TPRICE * 2000 / 10_000, 2, "staker share");
        uint256 bounty = 2 * TPRICE * 2000 / 10_000 * 1000 / 10_000; // to the outside finalizer
        vm.assertEq(credit(reporter), bounty);
        vm.assertEq(credit(treasury), 2 * TPRICE * 2000 / 10_000 - bounty);
        // No ether went anywhere.
        vm.assertEq(bsm.creditOf(developer), devBefore);
        vm.assertEq(bsm.creditOf(ops[0]), 0);
        (,, uint256 ethEscrow, uint256 ethCredits, uint256 ethReserve) = bsm.accounting();
        vm.assertEq(ethEscrow + ethCredits + ethReserve, 0);
        assertTokenConserved(address(usd));
        assertConserved();

        uint256 before = credit(staker);
        uint256 due = bsm.pendingTokenRewards(address(usd), ops[0], staker);
        vm.assertGe(due, 1);
        vm.prank(staker);
        bsm.claimRewards(ops[0]);
        vm.assertEq(credit(staker) - before, due);
        vm.assertEq(bsm.pendingTokenRewards(address(usd), ops[0], staker), 0);
        assertTokenConserved(address(usd));
    }

    /// The four shares of every paid operator-epoch sum to exactly its price in the token.
    function testFuzz_splitSumsToPrice(uint256 price, uint8 n) public {
        n = uint8(2 + n % 7);
        price = 1 + price % 1e15;
        address[] memory ops = registerN(n);
        I.JobSpec memory s = tspec(n, n, 1);
        s.pricePerOperatorEpoch = price;
        uint256 jobId = createTokenJob(s, address(usd));
        joinAll(jobId, ops);
        submitAll(jobId, keccak256("c"));
        finalize(jobId);
        uint256 total = credit(treasury) + credit(developer) + credit(reporter);
        for (uint256 i; i < n; ++i) {
            total += credit(ops[i]);
        }
        (, uint256 credits, uint256 reserve) = bsm.tokenAccounting(address(usd));
        vm.assertEq(total, credits, "credits");
        vm.assertEq(credits + reserve, price * n, "split != price");
        vm.assertEq(usd.balanceOf(address(bsm)), price * n);
        assertTokenConserved(address(usd));
    }

    /// Slashed stake is ether: it goes to the treasury in ether, whole; the finalizer's bounty
    /// is a share of the protocol's cut, in the job's token.
    function test_slashStaysInEther() public {
        (uint256 jobId, address[] memory ops) = runningTokenJob(3, 2);
        uint32[] memory p = fullParticipation(jobId);
        p[2] = 0;
        submit(jobId, ops[0], keccak256("c"), p);
        submit(jobId, ops[1], keccak256("c"), p);
        finalize(jobId); // ops[2] silent and in no round: dropout
        uint256 slashed = 1 ether * 500 / 10_000;
        vm.assertEq(bsm.creditOf(reporter), 0);
        vm.assertEq(bsm.creditOf(treasury), slashed);
        vm.assertEq(credit(reporter), 2 * (TPRICE * 2000 / 10_000) * 1000 / 10_000);
        vm.assertEq(credit(ops[2]), 0);
        vm.assertEq(credit(ops[0]), TPRICE * 4000 / 10_000);
        assertTokenConserved(address(usd));
        assertConserved();
    }

    function test_cancelRefundsOwnerNotPayer() public {
        I.JobSpec memory s = tspec(2, 4, 3);
        uint256 jobId = createTokenJob(s, address(usd));
        vm.prank(gateway);
        vm.expectRevert(abi.encodeWithSelector(I.NotJobCaller.selector, gateway, owner));
        bsm.cancelJob(jobId);
        vm.prank(owner);
        bsm.cancelJob(jobId);
        vm.assertEq(credit(owner), escrowOf(s));
        vm.assertEq(credit(gateway), 0);
        vm.assertEq(bsm.creditOf(owner), 0);
        vm.prank(owner);
        bsm.withdrawToken(address(usd));
        vm.assertEq(usd.balanceOf(owner), escrowOf(s));
        vm.assertEq(usd.balanceOf(address(bsm)), 0);
        assertTokenConserved(address(usd));
    }

    /// Cancelled while running: the epoch in progress is paid in the token, the rest of the
    /// token escrow goes back to the owner to the unit; no ether moves.
    function test_cancelRunningRefundsInToken() public {
        (uint256 jobId, address[] memory ops) = runningTokenJob(2, 3);
        vm.prank(gateway);
        vm.expectRevert(abi.encodeWithSelector(I.NotJobCaller.selector, gateway, owner));
        bsm.cancelJob(jobId);
        vm.prank(owner);
        bsm.cancelJob(jobId);
        submitAll(jobId, keccak256("c0"));
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Cancelled));
        vm.assertEq(credit(owner), TPRICE * 2 * 2);
        vm.assertEq(credit(ops[0]), TPRICE * 4000 / 10_000);
        vm.assertEq(bsm.creditOf(owner), 0);
        (uint256 e,,) = bsm.tokenAccounting(address(usd));
        vm.assertEq(e, 0, "no token escrow left");
        assertTokenConserved(address(usd));
        assertConserved();
    }

    function test_completedJobRefundsUnusedSeats() public {
        address[] memory ops = registerN(2);
        I.JobSpec memory s = tspec(2, 4, 1);
        uint256 jobId = createTokenJob(s, address(usd));
        joinAll(jobId, ops);
        submitAll(jobId, keccak256("c"));
        finalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        vm.assertEq(credit(owner), 2 * TPRICE);
        assertTokenConserved(address(usd));
    }

    function test_failedJobRefundsInToken() public {
        (uint256 jobId, address[] memory ops) = runningTokenJob(3, 2);
        uint32[] memory p = fullParticipation(jobId);
        for (uint256 e; e < 3; ++e) {
            // Three different votes: no quorum, nobody paid.
            for (uint256 i; i < 3; ++i) {
                submit(jobId, bsm.getMembers(jobId)[i], keccak256(abi.encode(e, i)), p);
            }
            finalize(jobId);
        }
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Failed));
        vm.assertEq(credit(owner), escrowOf(tspec(3, 3, 2)));
        vm.assertEq(credit(ops[0]), 0);
        assertTokenConserved(address(usd));
    }

    function test_unworkableCompensatesInToken() public {
        (uint256 jobId, address[] memory ops) = runningTokenJob(3, 2);
        bytes32 u = bsm.UNWORKABLE();
        uint32[] memory p = fullParticipation(jobId);
        for (uint256 i; i < 3; ++i) {
            submit(jobId, ops[i], u, p);
        }
        finalize(jobId);
        uint256 comp = TPRICE * COMP_BPS / 10_000;
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Failed));
        vm.assertEq(credit(ops[0]), comp);
        vm.assertEq(credit(owner), escrowOf(tspec(3, 3, 2)) - 3 * comp);
        assertTokenConserved(address(usd));
    }

    /// A delegation made while the operator is in a job earns nothing of the epochs already
    /// under way, in ether or in a token; older stake earns them all.
    function test_freshDelegationEarnsNoTokenRewardsYet() public {
        (uint256 jobId, address[] memory ops) = runningTokenJob(2, 3);
        address late = makeAddr("late");
        vm.deal(late, 10 ether);
        vm.prank(late);
        bsm.delegate{value: 1 ether}(ops[0]);
        submitAll(jobId, keccak256("c"));
        finalize(jobId);
        vm.assertEq(bsm.pendingTokenRewards(address(usd), ops[0], late), 0);
        vm.assertApproxEqAbs(
            bsm.pendingTokenRewards(address(usd), ops[0], ops[0]), TPRICE * 2000 / 10_000, 1, "self-stake earns"
        );
        vm.prank(late);
        bsm.claimRewards(ops[0]);
        vm.assertEq(credit(late), 0);
        assertTokenConserved(address(usd));
    }
}

contract ReRegisterTokenTest is TokenBase {
    /// An operator that deregisters after its pool earned in a token and registers again earns
    /// nothing twice: its new self-stake starts from the pool's current token rate.
    function test_reRegisteredOperatorEarnsNoPastTokenRewards() public {
        (uint256 jobId, address[] memory ops) = runningTokenJob(2, 1);
        submitAll(jobId, keccak256("c"));
        finalize(jobId);
        uint256 due = bsm.pendingTokenRewards(address(usd), ops[0], ops[0]);
        vm.assertApproxEqAbs(due, TPRICE * 2000 / 10_000, 1, "self-stake earned");
        vm.prank(ops[0]);
        bsm.deregisterOperator(); // unbonds all self-stake, settling its rewards
        vm.assertEq(bsm.tokenCreditOf(address(usd), ops[0]), TPRICE * 4000 / 10_000 + due);
        vm.warp(block.timestamp + UNBONDING);
        vm.prank(ops[0]);
        bsm.withdrawUnbonded(ops[0]);
        register(ops[0], MIN_STAKE);
        vm.assertEq(bsm.pendingTokenRewards(address(usd), ops[0], ops[0]), 0);
        vm.prank(ops[0]);
        bsm.claimRewards(ops[0]);
        vm.assertEq(bsm.tokenCreditOf(address(usd), ops[0]), TPRICE * 4000 / 10_000 + due);
        assertTokenConserved(address(usd));
    }
}

contract MaturedTokenRewardsTest is TokenBase {
    /// A delegation made while the operator is in a job earns its share of the token epochs
    /// paid after it matures, from the rate recorded when it matured.
    function test_maturedDelegationEarnsLaterTokenEpochs() public {
        (uint256 first, address[] memory ops) = runningTokenJob(2, 1);
        submitAll(first, keccak256("c"));
        finalize(first); // the pools now earn in the token
        uint256 waiting = createTokenJob(tspec(3, 3, 1), address(usd));
        joinAll(waiting, ops); // 2 of 3: open, but the operators are in a job
        address late = makeAddr("late");
        vm.deal(late, 10 ether);
        vm.prank(late);
        bsm.delegate{value: MIN_STAKE}(ops[0]); // fresh
        vm.assertEq(bsm.pendingTokenRewards(address(usd), ops[0], late), 0);
        vm.warp(block.timestamp + 2 * bsm.rewardPeriod());
        vm.prank(owner);
        bsm.cancelJob(waiting);
        uint256 jobId = createTokenJob(tspec(2, 2, 1), address(usd));
        joinAll(jobId, ops);
        submitAll(jobId, keccak256("d"));
        finalize(jobId);
        // Half the pool's shares are the delegation's: half the epoch's 20%.
        uint256 due = bsm.pendingTokenRewards(address(usd), ops[0], late);
        vm.assertApproxEqAbs(due, TPRICE * 2000 / 10_000 / 2, 1, "matured share");
        vm.prank(late);
        bsm.claimRewards(ops[0]);
        vm.assertEq(credit(late), due);
        assertTokenConserved(address(usd));
    }
}

contract WithdrawTokenTest is TokenBase {
    function test_withdrawsOnce() public {
        uint256 jobId = createTokenJob(tspec(2, 2, 1), address(usd));
        vm.prank(owner);
        bsm.cancelJob(jobId);
        uint256 amount = credit(owner);
        vm.expectEmit();
        emit I.TokenWithdrawn(address(usd), owner, amount);
        vm.prank(owner);
        bsm.withdrawToken(address(usd));
        vm.assertEq(usd.balanceOf(owner), amount);
        vm.prank(owner);
        vm.expectRevert(abi.encodeWithSelector(I.NothingToWithdraw.selector, owner));
        bsm.withdrawToken(address(usd));
    }

    function test_revert_NothingToWithdraw() public {
        vm.prank(caller);
        vm.expectRevert(abi.encodeWithSelector(I.NothingToWithdraw.selector, caller));
        bsm.withdrawToken(address(usd));
    }

    /// A token that calls back into `withdrawToken` (or ether `withdraw`) during the transfer
    /// pays once: the lock is shared with the ether path.
    function test_reentrantWithdrawPaysOnce() public {
        ReentrantToken t = new ReentrantToken();
        allow(address(t));
        t.mint(gateway, 1e12);
        uint256 jobA = createTokenJob(tspec(2, 2, 1), address(t));
        createTokenJob(tspec(2, 2, 1), address(t)); // a second escrow the attacker would drain
        vm.prank(owner);
        bsm.cancelJob(jobA);
        uint256 amount = bsm.tokenCreditOf(address(t), owner);
        vm.prank(owner);
        t.arm(address(bsm), abi.encodeCall(bsm.withdraw, ()));
        vm.prank(owner);
        bsm.withdrawToken(address(t));
        vm.assertTrue(t.reentered());
        vm.assertEq(t.result(), abi.encodeWithSelector(IReentrancy.ReentrancyGuardReentrantCall.selector));
        vm.assertEq(t.balanceOf(owner), amount);
        vm.assertEq(t.balanceOf(address(bsm)), amount);
        assertTokenConserved(address(t));
    }
}

/// A pool that earned in four tokens settles all of them on claim, in bounded gas.
contract ClaimRewardsTokensTest is TokenBase {
    function test_claimSettlesEveryToken() public {
        address[] memory ops = registerN(2);
        vm.prank(staker);
        bsm.delegate{value: 1 ether}(ops[0]);
        MintableToken[] memory ts = new MintableToken[](4);
        ts[0] = MintableToken(address(usd));
        for (uint256 k = 1; k < 4; ++k) {
            ts[k] = new MintableToken("T");
            allow(address(ts[k]));
            ts[k].mint(gateway, 1e15);
        }
        for (uint256 k; k < 4; ++k) {
            uint256 jobId = createTokenJob(tspec(2, 2, 1), address(ts[k]));
            joinAll(jobId, ops);
            submitAll(jobId, keccak256("c"));
            finalize(jobId);
        }
        uint256[] memory due = new uint256[](4);
        for (uint256 k; k < 4; ++k) {
            due[k] = bsm.pendingTokenRewards(address(ts[k]), ops[0], staker);
            vm.assertGe(due[k], 1);
        }
        vm.prank(staker);
        bsm.claimRewards(ops[0]);
        vm.assertLe(vm.lastCallGas().gasTotalUsed, 200_000, "claim in four tokens");
        for (uint256 k; k < 4; ++k) {
            vm.assertEq(bsm.tokenCreditOf(address(ts[k]), staker), due[k]);
            vm.assertEq(bsm.pendingTokenRewards(address(ts[k]), ops[0], staker), 0);
            vm.prank(staker);
            bsm.withdrawToken(address(ts[k]));
            vm.assertEq(ts[k].balanceOf(staker), due[k]);
            assertTokenConserved(address(ts[k]));
        }
    }
}

/// A token job finalized through the hooks stays under the core's gas cap per call, in the
/// worst case measured: every member's pool earned in four tokens and rolls a fresh slot.
contract HookGasCapTokenTest is HooksBase {
    function test_hookGasCap_tokenJobFourTokensRolling() public {
        address[] memory ops = registerN(32);
        for (uint256 i; i < 32; ++i) {
            vm.prank(staker);
            bsm.delegate{value: 1 ether}(ops[i]);
        }
        MintableToken[] memory ts = new MintableToken[](4);
        for (uint256 k; k < 4; ++k) {
            ts[k] = new MintableToken("T");
            vm.prank(developer);
            bsm.setPaymentToken(address(ts[k]), true);
            uint256 id = _tokenJob(ts[k]);
            joinAll(id, ops);
            submitAll(id, keccak256("t"));
            finalize(id);
        }
        // Fresh delegations (the operators are in a job), matured two periods later.
        uint256[2] memory held = [_tokenJob(ts[0]), _tokenJob(ts[0])];
        for (uint256 i; i < 32; ++i) {
            vm.prank(ops[i]);
            bsm.joinJob(held[i / 31]); // 31 and 1 of the 32 needed: both stay open
            vm.prank(staker);
            bsm.delegate{value: 1 ether}(ops[i]);
        }
        vm.startPrank(caller);
        bsm.cancelJob(held[0]);
        bsm.cancelJob(held[1]);
        vm.stopPrank();
        vm.warp(block.timestamp + 2 * bsm.rewardPeriod());
        uint256 jobId = _tokenJob(ts[1]);
        for (uint256 i; i < 32; ++i) {
            vm.prank(ops[i]);
            tangle.submitResult(JOIN, abi.encode(jobId));
        }
        submitAll(jobId, keccak256("c0"));
        uint256 calls = hookFinalize(jobId);
        vm.assertEq(uint8(status(jobId)), uint8(I.JobStatus.Completed));
        emit log_named_uint("max gas of one hook call, token job rolling", tangle.maxGas());
        vm.assertLe(tangle.maxGas(), tangle.HOOK_GAS());
        vm.assertGe(calls, 11);
    }

    function _tokenJob(MintableToken t) internal returns (uint256 id) {
        I.JobSpec memory s = spec(32, 32, 1);
        s.pricePerOperatorEpoch = 2_000_000;
        t.mint(caller, escrowOf(s));
        vm.startPrank(caller);
        t.approve(address(bsm), escrowOf(s));
        id = bsm.createJobWithToken(s, address(t), caller);
        vm.stopPrank();
    }
}

/// A stake pool's rewards in a token were kept at the ether scale (1e18 per share): in a
/// 2-decimal token a pool of 100 ether of shares earning 20 units an epoch moved the rate by
/// 0.2, rounded to 0, and every unit stayed in the reserve forever. Token rates now keep 1e36.
contract TokenRewardPrecisionTest is TokenBase {
    function _stakerRewards(uint8 decimals, uint256 price) internal returns (uint256 toStaker, uint256 toOperator) {
        DecimalsToken token = new DecimalsToken(decimals);
        allow(address(token));
        address[] memory ops = registerN(2);
        vm.deal(staker, 99 ether);
        vm.prank(staker);
        bsm.delegate{value: 99 ether}(ops[0]); // ops[0]'s pool: 100 ether of shares, 99% the staker's
        I.JobSpec memory s = spec(2, 2, 5);
        s.pricePerOperatorEpoch = price;
        token.mint(gateway, escrowOf(s));
        vm.startPrank(gateway);
        token.approve(address(bsm), escrowOf(s));
        uint256 jobId = bsm.createJobWithToken(s, address(token), owner);
        vm.stopPrank();
        joinAll(jobId, ops);
        for (uint256 e; e < 5; ++e) {
            submitAll(jobId, keccak256(abi.encode(e)));
            finalize(jobId);
        }
        toStaker = bsm.pendingTokenRewards(address(token), ops[0], staker);
        toOperator = bsm.pendingTokenRewards(address(token), ops[0], ops[0]);
        vm.prank(staker);
        bsm.claimRewards(ops[0]);
        vm.assertEq(bsm.tokenCreditOf(address(token), staker), toStaker, "claimed != pending");
        assertTokenConserved(address(token));
    }

    function test_twoDecimalTokenRewardsReachTheStakers() public {
        // 1.00 a seat-epoch: the pool's 20% is 20 units an epoch, 100 over the job.
        (uint256 toStaker, uint256 toOperator) = _stakerRewards(2, 100);
        vm.assertEq(toStaker, 99, "the staker's 99%");
        vm.assertEq(toOperator, 1, "the operator's 1%");
    }

    function test_eighteenDecimalTokenRewardsReachTheStakers() public {
        (uint256 toStaker, uint256 toOperator) = _stakerRewards(18, 1e18);
        vm.assertEq(toStaker, 99e16, "the staker's 99%");
        vm.assertEq(toOperator, 1e16, "the operator's 1%");
    }
}

