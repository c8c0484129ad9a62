// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Test} from "../utils/Test.sol";
import {TestUSD} from "../../src/devnet/TestUSD.sol";

contract TestUSDBase is Test {
    TestUSD internal usd;
    uint256 internal constant PAYER_KEY = 0xA11CE;
    address internal payer;
    address internal payee = address(0xB0B);

    function setUp() public virtual {
        usd = new TestUSD();
        payer = vm.addr(PAYER_KEY);
        usd.mint(payer, 100e6);
        vm.warp(1_000);
    }

    function _digest(
        bytes32 typehash,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce
    ) internal view returns (bytes32) {
        bytes32 structHash = keccak256(abi.encode(typehash, payer, to, value, validAfter, validBefore, nonce));
        return keccak256(abi.encodePacked("\x19\x01", usd.DOMAIN_SEPARATOR(), structHash));
    }

    function _sign(uint256 key, bytes32 digest) internal pure returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(key, digest);
        return abi.encodePacked(r, s, v);
    }

    function _authorize(uint256 key, uint256 value, uint256 validBefore, bytes32 nonce)
        internal
        view
        returns (bytes memory)
    {
        return _sign(key, _digest(usd.TRANSFER_WITH_AUTHORIZATION_TYPEHASH(), payee, value, 0, validBefore, nonce));
    }
}

contract TestUSD_decimals is TestUSDBase {
    function test_decimals_areSix() public view {
        vm.assertEq(uint256(usd.decimals()), 6);
    }
}

contract TestUSD_transferWithAuthorization is TestUSDBase {
    function test_transferWithAuthorization_movesTheValueOnce() public {
        bytes memory sig = _authorize(PAYER_KEY, 7e6, 2_000, bytes32(uint256(1)));
        usd.transferWithAuthorization(payer, payee, 7e6, 0, 2_000, bytes32(uint256(1)), sig);
        vm.assertEq(usd.balanceOf(payee), 7e6);
        vm.assertEq(usd.balanceOf(payer), 93e6);
        vm.assertTrue(usd.authorizationState(payer, bytes32(uint256(1))));
    }

    function test_transferWithAuthorization_vrsForm() public {
        bytes32 digest = _digest(usd.TRANSFER_WITH_AUTHORIZATION_TYPEHASH(), payee, 1e6, 0, 2_000, bytes32(uint256(2)));
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(PAYER_KEY, digest);
        usd.transferWithAuthorization(payer, payee, 1e6, 0, 2_000, bytes32(uint256(2)), v, r, s);
        vm.assertEq(usd.balanceOf(payee), 1e6);
    }

    function test_revert_AuthorizationUsedOrCanceled() public {
        bytes memory sig = _authorize(PAYER_KEY, 1e6, 2_000, bytes32(uint256(3)));
        usd.transferWithAuthorization(payer, payee, 1e6, 0, 2_000, bytes32(uint256(3)), sig);
        vm.expectRevert(
            abi.encodeWithSelector(TestUSD.AuthorizationUsedOrCanceled.selector, payer, bytes32(uint256(3)))
        );
        usd.transferWithAuthorization(payer, payee, 1e6, 0, 2_000, bytes32(uint256(3)), sig);
    }

    function test_revert_AuthorizationExpired() public {
        bytes memory sig = _authorize(PAYER_KEY, 1e6, 999, bytes32(uint256(4)));
        vm.expectRevert(abi.encodeWithSelector(TestUSD.AuthorizationExpired.selector, 999, 1_000));
        usd.transferWithAuthorization(payer, payee, 1e6, 0, 999, bytes32(uint256(4)), sig);
    }

    function test_revert_AuthorizationNotYetValid() public {
        bytes memory sig = _sign(
            PAYER_KEY,
            _digest(usd.TRANSFER_WITH_AUTHORIZATION_TYPEHASH(), payee, 1e6, 1_000, 2_000, bytes32(uint256(5)))
        );
        vm.expectRevert(abi.encodeWithSelector(TestUSD.AuthorizationNotYetValid.selector, 1_000, 1_000));
        usd.transferWithAuthorization(payer, payee, 1e6, 1_000, 2_000, bytes32(uint256(5)), sig);
    }

    function test_revert_InvalidAuthorizationSignature_otherSigner() public {
        bytes memory sig = _authorize(0xBAD, 1e6, 2_000, bytes32(uint256(6)));
        vm.expectRevert(abi.encodeWithSelector(TestUSD.InvalidAuthorizationSignature.selector, payer));
        usd.transferWithAuthorization(payer, payee, 1e6, 0, 2_000, bytes32(uint256(6)), sig);
    }

    function test_revert_InvalidAuthorizationSignature_raisedValue() public {
        bytes memory sig = _authorize(PAYER_KEY, 1e6, 2_000, bytes32(uint256(7)));
        vm.expectRevert(abi.encodeWithSelector(TestUSD.InvalidAuthorizationSignature.selector, payer));
        usd.transferWithAuthorization(payer, payee, 2e6, 0, 2_000, bytes32(uint256(7)), sig);
    }

    function testFuzz_transferWithAuthorization_anyValueUpToBalance(uint256 value, bytes32 nonce) public {
        value = bound(value, 0, 100e6);
        bytes memory sig = _authorize(PAYER_KEY, value, 2_000, nonce);
        usd.transferWithAuthorization(payer, payee, value, 0, 2_000, nonce, sig);
        vm.assertEq(usd.balanceOf(payee) + usd.balanceOf(payer), 100e6);
        vm.assertEq(usd.balanceOf(payee), value);
    }
}

contract TestUSD_receiveWithAuthorization is TestUSDBase {
    function test_receiveWithAuthorization_byThePayee() public {
        bytes memory sig = _sign(
            PAYER_KEY, _digest(usd.RECEIVE_WITH_AUTHORIZATION_TYPEHASH(), payee, 3e6, 0, 2_000, bytes32(uint256(8)))
        );
        vm.prank(payee);
        usd.receiveWithAuthorization(payer, payee, 3e6, 0, 2_000, bytes32(uint256(8)), sig);
        vm.assertEq(usd.balanceOf(payee), 3e6);
    }

    function test_revert_CallerNotPayee() public {
        bytes memory sig = _sign(
            PAYER_KEY, _digest(usd.RECEIVE_WITH_AUTHORIZATION_TYPEHASH(), payee, 3e6, 0, 2_000, bytes32(uint256(9)))
        );
        vm.expectRevert(abi.encodeWithSelector(TestUSD.CallerNotPayee.selector, address(this), payee));
        usd.receiveWithAuthorization(payer, payee, 3e6, 0, 2_000, bytes32(uint256(9)), sig);
    }
}

contract TestUSD_cancelAuthorization is TestUSDBase {
    function test_cancelAuthorization_blocksTheTransfer() public {
        bytes32 nonce = bytes32(uint256(10));
        bytes32 digest = keccak256(
            abi.encodePacked(
                "\x19\x01",
                usd.DOMAIN_SEPARATOR(),
                keccak256(abi.encode(usd.CANCEL_AUTHORIZATION_TYPEHASH(), payer, nonce))
            )
        );
        usd.cancelAuthorization(payer, nonce, _sign(PAYER_KEY, digest));
        bytes memory sig = _authorize(PAYER_KEY, 1e6, 2_000, nonce);
        vm.expectRevert(abi.encodeWithSelector(TestUSD.AuthorizationUsedOrCanceled.selector, payer, nonce));
        usd.transferWithAuthorization(payer, payee, 1e6, 0, 2_000, nonce, sig);
    }
}
