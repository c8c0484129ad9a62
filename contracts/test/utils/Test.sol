// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// The forge cheatcodes the tests use (forge-std is not on the npm registry in a usable form).
interface Vm {
    function prank(address sender) external;
    function startPrank(address sender) external;
    function stopPrank() external;
    function deal(address account, uint256 newBalance) external;
    function warp(uint256 newTimestamp) external;
    function expectRevert(bytes calldata revertData) external;
    function expectRevert(bytes4 selector) external;
    function expectRevert() external;
    function expectEmit(bool topic1, bool topic2, bool topic3, bool data) external;
    function expectEmit() external;
    function addr(uint256 privateKey) external pure returns (address);
    function getCode(string calldata artifactPath) external view returns (bytes memory);
    function label(address account, string calldata newLabel) external;
    function assume(bool condition) external pure;
    function snapshotGasLastCall(string calldata name) external returns (uint256 gasUsed);
    function lastCallGas() external view returns (Gas memory);
    function assertEq(uint256 left, uint256 right, string calldata err) external pure;
    function assertEq(uint256 left, uint256 right) external pure;
    function assertEq(address left, address right) external pure;
    function assertEq(bytes32 left, bytes32 right) external pure;
    function assertEq(bytes32 left, bytes32 right, string calldata err) external pure;
    function assertNotEq(address left, address right) external pure;
    function prevrandao(bytes32 newPrevrandao) external;
    function roll(uint256 newHeight) external;
    function setBlockhash(uint256 blockNumber, bytes32 blockHash) external;
    function assertGt(uint256 left, uint256 right) external pure;
    function assertEq(address left, address right, string calldata err) external pure;
    function assertNotEq(address left, address right, string calldata err) external pure;
    function chainId(uint256 newChainId) external;
    function assertEq(bool left, bool right) external pure;
    function assertEq(bytes calldata left, bytes calldata right) external pure;
    function assertEq(string calldata left, string calldata right) external pure;
    function assertTrue(bool condition, string calldata err) external pure;
    function assertTrue(bool condition) external pure;
    function assertFalse(bool condition) external pure;
    function assertLe(uint256 left, uint256 right, string calldata err) external pure;
    function assertGe(uint256 left, uint256 right, string calldata err) external pure;
    function assertGe(uint256 left, uint256 right) external pure;
    function assertLe(uint256 left, uint256 right) external pure;
    function assertLt(uint256 left, uint256 right, string calldata err) external pure;
    function sign(uint256 privateKey, bytes32 digest) external pure returns (uint8 v, bytes32 r, bytes32 s);
    function toString(uint256 value) external pure returns (string memory);
    function envOr(string calldata name, uint256 defaultValue) external view returns (uint256);
    function setEnv(string calldata name, string calldata value) external;
    function assertApproxEqAbs(uint256 left, uint256 right, uint256 maxDelta, string calldata err) external pure;
    function recordLogs() external;
    function getRecordedLogs() external returns (Log[] memory);
    function snapshotState() external returns (uint256 snapshotId);
    function revertToState(uint256 snapshotId) external returns (bool success);

    struct Gas {
        uint64 gasLimit;
        uint64 gasTotalUsed;
        uint64 gasMemoryUsed;
        int64 gasRefunded;
        uint64 gasRemaining;
    }

    struct Log {
        bytes32[] topics;
        bytes data;
        address emitter;
    }
}

/// Minimal test base: cheatcodes, bounded fuzz inputs and invariant target selection.
abstract contract Test {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));

    address[] private _targetContracts;

    function targetContracts() public view returns (address[] memory) {
        return _targetContracts;
    }

    function targetContract(address target) internal {
        _targetContracts.push(target);
    }

    function bound(uint256 x, uint256 lo, uint256 hi) internal pure returns (uint256) {
        require(lo <= hi, "bound: lo > hi");
        if (x >= lo && x <= hi) return x;
        uint256 size = hi - lo + 1;
        if (size == 0) return x; // full range
        return lo + (x % size);
    }

    function makeAddr(string memory name) internal returns (address a) {
        a = vm.addr(uint256(keccak256(bytes(name))));
        vm.label(a, name);
    }
}
