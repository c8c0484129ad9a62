// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

import {IDistributedTrainingBSMActions} from "./interfaces/IDistributedTrainingBSM.sol";
import {TangleTypes} from "./interfaces/IBlueprintServiceManager.sol";
import {BSMStakingActions} from "./BSMStaking.sol";
import {BSMSeats} from "./BSMSeats.sol";

/// @title DistributedTrainingBSMHooks
/// @notice tnt-core's IBlueprintServiceManager (see the interface for the pinned commit and how
/// the core calls). `DistributedTrainingBSM` reaches it through the views extension's fallback,
/// so it runs on the BSM's storage as the BSM. None needs ether, each stays under the core's
/// 500k gas cap at 32 members, and operator identity comes only from an `operator` argument
/// the core vouches for or an EIP-712 signature by the operator. What changes state runs in the
/// BSM itself through `hookAction` (a call to this same address, which only the BSM may make).
/// It also holds the seat draw (BSMSeats), reached the same way.
contract DistributedTrainingBSMHooks is BSMStakingActions, BSMSeats {
    /// Job ids of `onJobCall` / `onJobResult` (0 is reserved: jobs are created with `createJob`).
    uint8 public constant JOIN = _JOIN;
    uint8 public constant LEAVE = _LEAVE;
    uint8 public constant COMMIT = _COMMIT;
    uint8 public constant REVEAL = _REVEAL;
    uint8 public constant FINALIZE = _FINALIZE;
    /// Members an epoch's settlement covers per hook call, under the core's 500k gas cap.
    uint256 public constant HOOK_SETTLE_BATCH = _HOOK_SETTLE_BATCH;

    bytes32 private constant _DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    bytes32 private constant _NAME_HASH = keccak256("DistributedTrainingBSM");
    bytes32 private constant _VERSION_HASH = keccak256("1");
    bytes32 private constant _CALL_TYPEHASH =
        keccak256("OperatorCall(uint8 job,bytes args,uint256 nonce,uint64 attempt,uint64 deadline)");

    modifier onlyCore() {
        address core = _params.core;
        require(core != address(0) && msg.sender == core, NotCore(msg.sender, core));
        _;
    }

    function onBlueprintCreated(uint64, address, address) external onlyCore {}

    /// `registrationInputs` = `abi.encode(bytes32 peerKey, string[] multiaddrs, string hardware,
    /// uint256 minPricePerEpoch)`. The core forwards no stake: the operator adds it with `stake()`.
    function onRegister(address operator, bytes calldata registrationInputs) external payable onlyCore {
        Operator storage o = _operators[operator];
        require(!o.registered, AlreadyRegistered(operator));
        (bytes32 peerKey, string[] memory multiaddrs, string memory hardware, uint256 price) =
            abi.decode(registrationInputs, (bytes32, string[], string, uint256));
        o.registered = true;
        _setNetwork(o, peerKey, multiaddrs, hardware, price);
        _enlist(operator);
        emit OperatorRegistered(operator, peerKey, 0);
    }

    function onUnregister(address operator) external onlyCore {
        _act(_DEREGISTER, operator, "");
    }

    /// A service request must carry a valid `abi.encode(JobSpec)`. It creates no job and joins
    /// nobody: the core holds the request's payment, and listed operators have not agreed to
    /// anything. Jobs are created and escrowed with `createJob`.
    function onRequest(uint64, address, address[] calldata, bytes calldata requestInputs, uint64, address, uint256)
        external
        payable
        onlyCore
    {
        _checkSpec(abi.decode(requestInputs, (JobSpec)));
    }

    /// JOIN, LEAVE, COMMIT, REVEAL: `inputs` = `abi.encode(address operator, bytes args, uint64
    /// attempt, uint64 deadline, bytes signature)`, signed by `operator` over EIP-712
    /// `OperatorCall(uint8 job,bytes args,uint256 nonce,uint64 attempt,uint64 deadline)` with its
    /// next `operatorNonce`; `args` as for `onJobResult`. The call is void after `deadline`,
    /// once the job (the first word of `args`) is past epoch attempt `attempt` (0: never
    /// started), and once the operator used or cancelled the nonce: a signed call that reverted
    /// cannot be replayed later into a seat the operator does not know it holds.
    /// FINALIZE: `inputs` = `abi.encode(uint256 jobId, uint256 epoch)`; settles the next
    /// `HOOK_SETTLE_BATCH` members, then ends the epoch in one more call (call again until
    /// `EpochFinalized`); it earns no finalizer reward (the core's call settles as the treasury).
    function onJobCall(uint64, uint8 job, uint64, bytes calldata inputs) external payable onlyCore {
        if (job == _FINALIZE) {
            _act(_FINALIZE, _params.treasury, inputs);
            return;
        }
        require(job >= _JOIN && job < _FINALIZE, UnknownJobKind(job));
        (address operator, bytes memory args, uint64 attempt, uint64 deadline, bytes memory signature) =
            abi.decode(inputs, (address, bytes, uint64, uint64, bytes));
        require(block.timestamp <= deadline, SignedCallExpired(operator, deadline, block.timestamp));
        uint256 jobId = abi.decode(args, (uint256));
        uint64 current = _jobs[jobId].attempt;
        require(attempt == current, SignedCallStale(operator, jobId, attempt, current));
        _checkSigned(
            operator,
            keccak256(abi.encode(_CALL_TYPEHASH, job, keccak256(args), _nonces[operator]++, attempt, deadline)),
            signature
        );
        _act(job, operator, args);
    }

    /// Reverts unless `signature` is `operator`'s EIP-712 signature of `structHash`.
    function _checkSigned(address operator, bytes32 structHash, bytes memory signature) private view {
        bytes32 digest = keccak256(
            abi.encodePacked(
                "\x19\x01",
                keccak256(abi.encode(_DOMAIN_TYPEHASH, _NAME_HASH, _VERSION_HASH, block.chainid, address(this))),
                structHash
            )
        );
        (address signer, ECDSA.RecoverError err,) = ECDSA.tryRecover(digest, signature);
        require(
            err == ECDSA.RecoverError.NoError && signer == operator,
            InvalidOperatorSignature(operator, _nonces[operator] - 1)
        );
    }

    /// JOIN, LEAVE, COMMIT, REVEAL and FINALIZE as the result-sending `operator` (which the core
    /// vouches for), with `outputs` = the call's args: `jobId`; `jobId`; `(jobId, epoch,
    /// commitment)`; `(jobId, epoch, checkpoint, participation, salt)`; `(jobId, epoch)`.
    function onJobResult(uint64, uint8 job, uint64, address operator, bytes32, bytes calldata outputs)
        external
        payable
        onlyCore
    {
        require(job >= _JOIN && job <= _FINALIZE, UnknownJobKind(job));
        _act(job, operator, outputs);
    }

    /// `offender` = `abi.encodePacked(operator)` as the core sends it (an abi-encoded address is
    /// accepted too); proceeds go to the treasury.
    function onSlash(uint64, bytes calldata offender, uint8 slashPercent) external onlyCore {
        require(slashPercent > 0 && slashPercent <= _MAX_SLASH_BPS / 100, InvalidSlashPercent(slashPercent));
        address operator = offender.length == 20 ? address(bytes20(offender)) : abi.decode(offender, (address));
        _act(_SLASH, operator, abi.encode(uint256(slashPercent) * 100));
    }

    function querySlashingOrigin(uint64) external view returns (address) {
        return address(this);
    }

    function queryDeveloperPaymentAddress(uint64) external view returns (address payable) {
        return payable(_params.developer);
    }

    function queryIsPaymentAssetAllowed(uint64, address asset) external pure returns (bool) {
        return asset == address(0);
    }

    /// Runs `action` in the BSM (this code runs as the BSM, so `address(this)` is the BSM).
    function _act(uint8 action, address operator, bytes memory args) private {
        IDistributedTrainingBSMActions(address(this)).hookAction(action, operator, args);
    }

    // ---------------------------------------------------------------- Tangle hooks with no state
    // The rest of tnt-core's IBlueprintServiceManager: the core calls these best effort (or reads
    // them with a fallback to its defaults); this blueprint keeps no state for them.

    // Payable in the core's interface; this blueprint takes no ether through them (none could
    // ever leave the BSM: it is not anyone's credit).
    function onUpdatePreferences(address, bytes calldata) external payable {
        require(msg.value == 0, EtherNotAccepted(msg.value));
    }

    function onApprove(address, uint64, uint8) external payable {
        require(msg.value == 0, EtherNotAccepted(msg.value));
    }

    function onReject(address, uint64) external {}

    function onServiceInitialized(uint64, uint64, uint64, address, address[] calldata, uint64) external {}

    function onServiceTermination(uint64, address) external {}

    function onOperatorJoined(uint64, address, uint16) external {}

    function onOperatorLeft(uint64, address) external {}

    function onExitScheduled(uint64, address, uint64) external {}

    function onExitCanceled(uint64, address) external {}

    function onUnappliedSlash(uint64, bytes calldata, uint8) external {}

    function onAggregatedResult(
        uint64,
        uint8,
        uint64,
        bytes calldata,
        uint256,
        uint256[2] calldata,
        uint256[4] calldata
    ) external {}

    function onBinaryVersionPublished(uint64, TangleTypes.BinaryVersion calldata, string calldata) external {}

    function onOperatorBinaryAcked(uint64, uint64, address) external {}

    function getHeartbeatInterval(uint64) external pure returns (bool, uint64) {
        return (true, 0);
    }

    function getHeartbeatThreshold(uint64) external pure returns (bool, uint8) {
        return (true, 0);
    }

    function getSlashingWindow(uint64) external pure returns (bool, uint64) {
        return (true, 0);
    }

    function getExitConfig(uint64) external pure returns (bool, uint64, uint64, bool) {
        return (true, 0, 0, false);
    }

    function getNonPaymentTerminationPolicy(uint64) external pure returns (bool, uint64) {
        return (true, 0);
    }

    function forceRemoveAllowsBelowMin(uint64) external pure returns (bool) {
        return false;
    }

    function computeBillAdjustmentBps(uint64, uint64, uint64) external pure returns (uint16) {
        return 10_000;
    }

    function canJoin(uint64, address) external pure returns (bool) {
        return true;
    }

    function canLeave(uint64, address) external pure returns (bool) {
        return true;
    }

    /// Disputes and slashes for this blueprint are raised by the BSM itself.
    function queryDisputeOrigin(uint64) external view returns (address) {
        return address(this);
    }

    function getRequiredResultCount(uint64, uint8) external pure returns (uint32) {
        return 1;
    }

    function requiresAggregation(uint64, uint8) external pure returns (bool) {
        return false;
    }

    function getAggregationThreshold(uint64, uint8) external pure returns (uint16, uint8) {
        return (6700, 0);
    }

    function getMinOperatorStake() external view returns (bool, uint256) {
        return (false, _params.minStake);
    }
}
