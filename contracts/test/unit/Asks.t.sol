// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";
import {MintableToken} from "../utils/BadTokens.sol";
import {TokenBase} from "./Tokens.t.sol";

interface ISafeCast {
    error SafeCastOverflowedUintDowncast(uint8 bits, uint256 value);
}

/// An operator's ask per payment unit: ether and each allowed token.
abstract contract AskBase is TokenBase {
    address internal a;

    function setUp() public virtual override {
        super.setUp();
        a = op(1);
        vm.deal(a, MIN_STAKE);
        // As the quickstart registers: an ask in ether, nothing said about tokens.
        vm.prank(a);
        bsm.registerOperator{value: MIN_STAKE}(peerKeyOf(a), addrsOf(1), "cpu:2", 0.01 ether);
    }

    function setAsk(address token, uint256 ask) internal {
        vm.prank(a);
        bsm.updateAsk(token, ask);
    }

    function askOf(address token) internal view returns (bool takes, uint256 ask) {
        return bsm.askIn(a, token);
    }
}

contract UpdateAskTest is AskBase {
    function test_setsTheTokenAskAlone() public {
        vm.expectEmit();
        emit I.AskUpdated(a, address(usd), 5_000);
        setAsk(address(usd), 5_000);
        (bool takes, uint256 ask) = askOf(address(usd));
        vm.assertTrue(takes);
        vm.assertEq(ask, 5_000);
        // The ask in ether is another unit's and stays.
        vm.assertEq(bsm.getOperator(a).minPricePerEpoch, 0.01 ether);
    }

    function test_etherIsAddressZero() public {
        vm.expectEmit();
        emit I.AskUpdated(a, address(0), 0);
        setAsk(address(0), 0);
        vm.assertEq(bsm.getOperator(a).minPricePerEpoch, 0);
        (bool takes, uint256 ask) = askOf(address(0));
        vm.assertTrue(takes);
        vm.assertEq(ask, 0);
    }

    /// A zero ask in a token is an ask (any price), not "none set".
    function test_zeroTokenAskTakesAnyPrice() public {
        setAsk(address(usd), 0);
        (bool takes, uint256 ask) = askOf(address(usd));
        vm.assertTrue(takes);
        vm.assertEq(ask, 0);
    }

    function test_revert_NotRegistered() public {
        address stranger = makeAddr("stranger");
        vm.prank(stranger);
        vm.expectRevert(abi.encodeWithSelector(I.NotRegistered.selector, stranger));
        bsm.updateAsk(address(usd), 1);
    }

    function test_revert_TokenNotAllowed() public {
        MintableToken other = new MintableToken("T2");
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.TokenNotAllowed.selector, address(other)));
        bsm.updateAsk(address(other), 1);
        vm.prank(developer);
        bsm.setPaymentToken(address(usd), false);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.TokenNotAllowed.selector, address(usd)));
        bsm.updateAsk(address(usd), 1);
    }

    /// Ether asks are kept in 96 bits, as `registerOperator` keeps them.
    function test_revert_SafeCastOverflowedUintDowncast() public {
        uint256 tooHigh = uint256(type(uint96).max) + 1;
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(ISafeCast.SafeCastOverflowedUintDowncast.selector, 96, tooHigh));
        bsm.updateAsk(address(0), tooHigh);
    }
}

contract AskInTest is AskBase {
    /// No ask in a token and an ask in ether: no job in that token (units do not compare).
    function test_etherAskWithoutTokenAskTakesNone() public view {
        (bool takes,) = askOf(address(usd));
        vm.assertFalse(takes);
    }

    /// No ask in a token and none in ether: any price in it.
    function test_noAskAnywhereTakesAnyPrice() public {
        setAsk(address(0), 0);
        (bool takes, uint256 ask) = askOf(address(usd));
        vm.assertTrue(takes);
        vm.assertEq(ask, 0);
    }

    function test_unregisteredTakesAnyEtherPrice() public {
        (bool takes, uint256 ask) = bsm.askIn(makeAddr("nobody"), address(0));
        vm.assertTrue(takes);
        vm.assertEq(ask, 0);
    }
}

/// `joinJob` checks the job's price against the ask in the job's own unit.
contract JoinAskTest is AskBase {
    /// The issue's operator: registered with 0.01 ETH, refused a 2 TUSD job with a reason that
    /// names the token, and seated once it sets an ask in it.
    function test_tokenJobAfterUpdateAsk() public {
        uint256 jobId = createTokenJob(tspec(2, 2, 1), address(usd));
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.NoAskInToken.selector, a, address(usd)));
        bsm.joinJob(jobId);
        setAsk(address(usd), TPRICE);
        vm.prank(a);
        bsm.joinJob(jobId);
        vm.assertEq(bsm.getOperator(a).activeJobs, 1);
    }

    /// A token ask leaves ether jobs to the ether ask.
    function test_etherJobsKeepTheEtherAsk() public {
        setAsk(address(usd), 0);
        uint256 jobId = createJob(spec(2, 2, 1));
        setAsk(address(0), PRICE + 1);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.PriceBelowAsk.selector, PRICE, PRICE + 1));
        bsm.joinJob(jobId);
        setAsk(address(0), PRICE);
        vm.prank(a);
        bsm.joinJob(jobId);
    }

    function test_revert_NoAskInToken() public {
        uint256 jobId = createTokenJob(tspec(2, 2, 1), address(usd));
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.NoAskInToken.selector, a, address(usd)));
        bsm.joinJob(jobId);
    }

    function test_revert_PriceBelowTokenAsk() public {
        setAsk(address(usd), TPRICE + 1);
        uint256 jobId = createTokenJob(tspec(2, 2, 1), address(usd));
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.PriceBelowTokenAsk.selector, address(usd), TPRICE, TPRICE + 1));
        bsm.joinJob(jobId);
    }

    /// Seated exactly when the price reaches the ask, in the token's units, whatever the ether ask.
    function testFuzz_joinsIffPriceReachesTokenAsk(uint256 price, uint256 ask, uint96 etherAsk) public {
        price = bound(price, 1, 1e30);
        ask = bound(ask, 0, 1e30);
        setAsk(address(0), etherAsk);
        setAsk(address(usd), ask);
        I.JobSpec memory s = tspec(2, 2, 1);
        s.pricePerOperatorEpoch = price;
        uint256 jobId = createTokenJob(s, address(usd));
        vm.prank(a);
        if (price < ask) {
            vm.expectRevert(abi.encodeWithSelector(I.PriceBelowTokenAsk.selector, address(usd), price, ask));
        }
        bsm.joinJob(jobId);
        vm.assertEq(bsm.getOperator(a).activeJobs, price < ask ? 0 : 1);
    }
}
