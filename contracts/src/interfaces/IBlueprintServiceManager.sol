// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @title IBlueprintServiceManager
/// @notice The hooks through which a Tangle core drives a blueprint (names and arguments as in
/// tnt-core). Each hook runs the same internal logic as the matching direct function; only the
/// configured core may call them.
/// @dev Job ids of `onJobCall`: SUBMIT_JOB=0, JOIN=1, LEAVE=2, SUBMIT_CHECKPOINT=3, FINALIZE=4.
/// `inputs` is `abi.encode(address actor, bytes args)`: the core vouches for `actor`.
/// `onJobResult` accepts JOIN, LEAVE and SUBMIT_CHECKPOINT from `operator` with `outputs` = args.
interface IBlueprintServiceManager {
    /// @notice An operator registers. `registrationInputs` is
    /// `abi.encode(bytes32 peerKey, string[] multiaddrs, string hardware, uint256 minPricePerEpoch)`;
    /// `msg.value` is the self-stake.
    function onRegister(address operator, bytes calldata registrationInputs) external payable;

    /// @notice An operator leaves the blueprint (no active jobs); its stake starts unbonding.
    function onUnregister(address operator) external;

    /// @notice A service request creates a job. `requestInputs` is `abi.encode(JobSpec)`, the
    /// payment is native (`paymentAsset == address(0)`, `msg.value == paymentAmount`) and each
    /// listed operator joins the job.
    function onRequest(
        uint64 requestId,
        address requester,
        address[] calldata operators,
        bytes calldata requestInputs,
        uint64 ttl,
        address paymentAsset,
        uint256 paymentAmount
    ) external payable;

    /// @notice A job call; see the contract-level dev note for the job ids and encoding.
    function onJobCall(uint64 serviceId, uint8 job, uint64 jobCallId, bytes calldata inputs) external payable;

    /// @notice An operator's job result; see the contract-level dev note.
    function onJobResult(
        uint64 serviceId,
        uint8 job,
        uint64 jobCallId,
        address operator,
        bytes32 inputsHash,
        bytes calldata outputs
    ) external;

    /// @notice The core slashes `offender` (`abi.encode(address)`) by `slashPercent` percent of
    /// its pool (active and unbonding stake); proceeds go to the treasury.
    function onSlash(uint64 serviceId, bytes calldata offender, uint8 slashPercent) external;

    /// @notice The address allowed to request slashes for `serviceId`: this contract.
    function querySlashingOrigin(uint64 serviceId) external view returns (address);

    /// @notice Where the developer share of `serviceId`'s fees is credited.
    function queryDeveloperPaymentAddress(uint64 serviceId) external view returns (address payable);

    /// @notice Only the native asset pays for jobs.
    function queryIsPaymentAssetAllowed(uint64 serviceId, address asset) external view returns (bool);
}
