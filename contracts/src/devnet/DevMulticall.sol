// SPDX-License-Identifier: MIT
pragma solidity ^0.8.26;

/// @title DevMulticall
/// @notice Batched read calls for a devnet: `tryAggregate` with Multicall3's signature, so tools
/// that read through Multicall3's fixed address (the x402 facilitator does) work on a local chain
/// once this runtime code is placed there. Each call runs with this contract as `msg.sender`.
contract DevMulticall {
    struct Call {
        address target;
        bytes callData;
    }

    struct Result {
        bool success;
        bytes returnData;
    }

    /// @notice A call failed while `requireSuccess` was set.
    error CallFailed(uint256 index);

    /// @notice Runs every call in order; each result says whether it succeeded and what it
    /// returned (its revert data when it failed).
    function tryAggregate(bool requireSuccess, Call[] calldata calls)
        external
        payable
        returns (Result[] memory returnData)
    {
        returnData = new Result[](calls.length);
        for (uint256 i = 0; i < calls.length; ++i) {
            (bool ok, bytes memory data) = calls[i].target.call(calls[i].callData);
            require(ok || !requireSuccess, CallFailed(i));
            returnData[i] = Result(ok, data);
        }
    }
}
