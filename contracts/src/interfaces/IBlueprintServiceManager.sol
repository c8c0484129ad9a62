// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @notice The struct tnt-core passes to `onBinaryVersionPublished` (tnt-core `Types.BinaryVersion`).
library TangleTypes {
    struct BinaryVersion {
        uint64 versionId;
        uint64 publishedAt;
        bool deprecated;
        bytes32 sha256Hash;
        bytes32 attestationHash;
    }
}

/// @title IBlueprintServiceManager
/// @notice The hooks through which Tangle's core drives a blueprint: tnt-core's
/// `src/interfaces/IBlueprintServiceManager.sol` at commit
/// 8a2b24c1ae2c9dad5a43654b2f5ab16cfe49397e (same functions, arguments and selectors).
/// @dev How the core calls them (tnt-core `src/core/Base.sol`): `manager.call{gas: 500_000}`
/// with no ether; `onBlueprintCreated`, `onRegister`, `onRequest` and `onJobCall` revert the
/// core's transaction on failure, the others are best effort. The core vouches for the
/// `operator` arguments of `onRegister`, `onUnregister` and `onJobResult` (the operator that
/// sent the result) and for nothing inside `inputs`. `onSlash`'s `offender` is
/// `abi.encodePacked(operator)` (20 bytes).
interface IBlueprintServiceManager {
    function onBlueprintCreated(uint64 blueprintId, address owner, address tangleCore) external;
    function onRegister(address operator, bytes calldata registrationInputs) external payable;
    function onUnregister(address operator) external;
    function onUpdatePreferences(address operator, bytes calldata newPreferences) external payable;
    function getHeartbeatInterval(uint64 serviceId) external view returns (bool useDefault, uint64 interval);
    function getHeartbeatThreshold(uint64 serviceId) external view returns (bool useDefault, uint8 threshold);
    function getSlashingWindow(uint64 serviceId) external view returns (bool useDefault, uint64 window);
    function getExitConfig(uint64 serviceId)
        external
        view
        returns (bool useDefault, uint64 minCommitmentDuration, uint64 exitQueueDuration, bool forceExitAllowed);
    function getNonPaymentTerminationPolicy(uint64 serviceId)
        external
        view
        returns (bool useDefault, uint64 graceIntervals);
    function forceRemoveAllowsBelowMin(uint64 serviceId) external view returns (bool ok);
    function computeBillAdjustmentBps(uint64 serviceId, uint64 periodStart, uint64 periodEnd)
        external
        view
        returns (uint16 adjustmentBps);
    function onRequest(
        uint64 requestId,
        address requester,
        address[] calldata operators,
        bytes calldata requestInputs,
        uint64 ttl,
        address paymentAsset,
        uint256 paymentAmount
    ) external payable;
    function onApprove(address operator, uint64 requestId, uint8 stakingPercent) external payable;
    function onReject(address operator, uint64 requestId) external;
    function onServiceInitialized(
        uint64 blueprintId,
        uint64 requestId,
        uint64 serviceId,
        address owner,
        address[] calldata permittedCallers,
        uint64 ttl
    ) external;
    function onServiceTermination(uint64 serviceId, address owner) external;
    function canJoin(uint64 serviceId, address operator) external view returns (bool allowed);
    function onOperatorJoined(uint64 serviceId, address operator, uint16 exposureBps) external;
    function canLeave(uint64 serviceId, address operator) external view returns (bool allowed);
    function onOperatorLeft(uint64 serviceId, address operator) external;
    function onExitScheduled(uint64 serviceId, address operator, uint64 executeAfter) external;
    function onExitCanceled(uint64 serviceId, address operator) external;
    function onJobCall(uint64 serviceId, uint8 job, uint64 jobCallId, bytes calldata inputs) external payable;
    function onJobResult(
        uint64 serviceId,
        uint8 job,
        uint64 jobCallId,
        address operator,
        bytes32 inputsHash,
        bytes calldata outputs
    ) external payable;
    function onUnappliedSlash(uint64 serviceId, bytes calldata offender, uint8 slashPercent) external;
    function onSlash(uint64 serviceId, bytes calldata offender, uint8 slashPercent) external;
    function querySlashingOrigin(uint64 serviceId) external view returns (address slashingOrigin);
    function queryDisputeOrigin(uint64 serviceId) external view returns (address disputeOrigin);
    function queryDeveloperPaymentAddress(uint64 serviceId)
        external
        view
        returns (address payable developerPaymentAddress);
    function queryIsPaymentAssetAllowed(uint64 serviceId, address asset) external view returns (bool isAllowed);
    function getRequiredResultCount(uint64 serviceId, uint8 jobIndex) external view returns (uint32 required);
    function requiresAggregation(uint64 serviceId, uint8 jobIndex) external view returns (bool required);
    function getAggregationThreshold(uint64 serviceId, uint8 jobIndex)
        external
        view
        returns (uint16 thresholdBps, uint8 thresholdType);
    function onAggregatedResult(
        uint64 serviceId,
        uint8 job,
        uint64 jobCallId,
        bytes calldata output,
        uint256 signerBitmap,
        uint256[2] calldata aggregatedSignature,
        uint256[4] calldata aggregatedPubkey
    ) external;
    function getMinOperatorStake() external view returns (bool useDefault, uint256 minStake);
    function onBinaryVersionPublished(
        uint64 blueprintId,
        TangleTypes.BinaryVersion calldata version,
        string calldata binaryUri
    ) external;
    function onOperatorBinaryAcked(uint64 serviceId, uint64 versionId, address operator) external;
}
