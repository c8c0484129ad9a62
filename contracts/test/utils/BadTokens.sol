// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// A plain 6-decimal token anyone can mint.
contract MintableToken is ERC20 {
    constructor(string memory name) ERC20(name, name) {}

    function decimals() public pure override returns (uint8) {
        return 6;
    }

    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }
}

/// A mintable token with any number of decimals.
contract DecimalsToken is ERC20 {
    uint8 private immutable _DECIMALS;

    constructor(uint8 decimals_) ERC20("DEC", "DEC") {
        _DECIMALS = decimals_;
    }

    function decimals() public view override returns (uint8) {
        return _DECIMALS;
    }

    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }
}

/// Burns 1% of every transfer: the recipient receives less than `amount`.
contract FeeOnTransferToken is MintableToken("FEE") {
    function _update(address from, address to, uint256 amount) internal override {
        if (from != address(0) && to != address(0)) {
            uint256 fee = amount / 100;
            super._update(from, address(0), fee);
            amount -= fee;
        }
        super._update(from, to, amount);
    }
}

/// Reports success for `transferFrom` without moving anything.
contract LyingToken is MintableToken("LIE") {
    function transferFrom(address, address, uint256) public pure override returns (bool) {
        return true;
    }
}

/// Calls `target` with `data` from inside every transfer, once, and records how that call ended.
contract ReentrantToken is MintableToken("RE") {
    address public target;
    bytes public data;
    bool public reentered;
    bytes public result;

    function arm(address target_, bytes calldata data_) external {
        (target, data, reentered) = (target_, data_, false);
    }

    function _update(address from, address to, uint256 amount) internal override {
        super._update(from, to, amount);
        if (target != address(0) && !reentered && from != address(0)) {
            reentered = true;
            (, result) = target.call(data);
        }
    }
}
