// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @title IDistributedTrainingBSM
/// @notice Membership, jobs, epochs, checkpoint commitments, fees and slashing for distributed
/// training with DeMo. Operators stake and register permissionlessly, stakers delegate to them,
/// callers escrow payment for training jobs, operators train each epoch together and commit the
/// resulting checkpoint hash; anyone finalizes an epoch once every member submitted or the
/// deadline passed. The (checkpoint, participation) pair backed by >= 2/3 of the epoch's members
/// is the result: members that agree are paid, members that disagree, stayed silent or did not
/// sync are slashed.
/// @dev Money is pull-only: every payout is a credit claimed with `withdraw()`. At all times
/// `address(this).balance == staked + unbonding + escrow + credits + rewardReserve` (see
/// `accounting()`).
interface IDistributedTrainingBSM {
    // ---------------------------------------------------------------- types

    /// @notice Training objective of a job.
    enum Method {
        CPT,
        SFT,
        DPO,
        GRPO
    }

    /// @notice Lifecycle of a job. `Open`: waiting for `minOperators` members before the first
    /// epoch, or for any member after a boundary left none. `Running`: an epoch is in progress.
    enum JobStatus {
        None,
        Open,
        Running,
        Completed,
        Failed,
        Cancelled
    }

    /// @notice Why stake was slashed.
    enum SlashReason {
        Fabrication,
        Dropout,
        SyncFailure,
        External
    }

    /// @notice Deploy-time parameters. The four fee shares are basis points summing to 10000.
    struct Params {
        uint16 operatorBps;
        uint16 stakerBps;
        uint16 protocolBps;
        uint16 developerBps;
        uint16 fabricationSlashBps;
        uint16 dropoutSlashBps;
        uint16 syncFailSlashBps;
        /// Share of every slashed amount credited to whoever triggered the slash (finalizer).
        uint16 reporterBountyBps;
        /// Minimum share of an epoch's sync rounds a member must have contributed to.
        uint16 syncThresholdBps;
        /// Hard cap on members per job; every loop in the contract is bounded by it.
        uint8 maxOperators;
        /// Consecutive epochs without quorum after which a job fails.
        uint8 maxFailedEpochs;
        uint64 unbondingPeriod;
        uint256 minStake;
        address treasury;
        address developer;
        /// Tangle core allowed to call the hooks; address(0) disables them.
        address core;
    }

    /// @notice What a caller pays for.
    struct JobSpec {
        bytes32 modelHash; // model config hash, or base checkpoint hash (epoch 0 start state)
        string modelUri;
        bytes32 datasetHash;
        string datasetUri;
        Method method;
        uint32 totalEpochs;
        uint32 stepsPerEpoch;
        uint32 syncInterval; // K inner steps between DeMo syncs
        uint16 topkPerChunk;
        uint8 quantBits; // 1 or 2
        uint8 minOperators;
        uint8 maxOperators;
        uint64 epochDuration; // seconds from epoch start to its submission deadline
        bool teeRequired;
        uint256 pricePerOperatorEpoch;
    }

    /// @notice Mutable state of a job.
    struct JobState {
        address caller;
        JobStatus status;
        uint32 epoch; // index of the epoch in progress (== number of finalized epochs)
        uint8 failedEpochs; // consecutive epochs without quorum
        uint64 attempt; // global attempt counter of the epoch in progress; keys submissions
        uint64 epochStart;
        uint256 escrow; // not yet earned
        bytes32 checkpoint; // latest finalized checkpoint (start state of `epoch`)
    }

    struct OperatorInfo {
        bool registered;
        uint32 activeJobs;
        uint256 minPricePerEpoch;
        bytes32 peerKey;
        string[] multiaddrs;
        string hardware;
        bytes32 attestationReport;
        uint8 teeType;
        address attestationVerifier;
    }

    struct PoolInfo {
        uint256 totalShares;
        uint256 totalAssets;
        uint256 unbondingShares;
        uint256 unbondingAssets;
        uint256 rewardPerShare; // scaled by 1e18
        uint256 rewardReserve;
    }

    // ---------------------------------------------------------------- errors

    error BpsSumNot10000(uint256 sum);
    error SlashBpsTooHigh(uint256 bps, uint256 max);
    error BpsTooHigh(uint256 bps);
    error InvalidMaxOperators(uint256 maxOperators, uint256 cap);
    error ZeroAddress();
    error ZeroValue();
    error NotCore(address caller, address core);
    error StakeBelowMinimum(uint256 stake, uint256 minStake);
    error AlreadyRegistered(address operator);
    error NotRegistered(address operator);
    error InsufficientStake(uint256 requested, uint256 available);
    error OperatorHasActiveJobs(address operator, uint256 activeJobs);
    error NothingUnbonding(address operator, address account);
    error StillUnbonding(uint256 unlockAt, uint256 nowTs);
    error NothingToWithdraw(address account);
    error TransferFailed(address to, uint256 amount);
    error InvalidOperatorRange(uint256 minOperators, uint256 maxOperators, uint256 cap);
    error InvalidSchedule(uint256 totalEpochs, uint256 stepsPerEpoch, uint256 syncInterval);
    error InvalidCompression(uint256 topkPerChunk, uint256 quantBits);
    error InvalidEpochDuration(uint256 duration);
    error WrongEscrow(uint256 expected, uint256 sent);
    error UnknownJob(uint256 jobId);
    error NotJobCaller(address sender, address caller);
    error JobNotOpen(uint256 jobId, JobStatus status);
    error JobNotRunning(uint256 jobId, JobStatus status);
    error JobFull(uint256 jobId, uint256 members, uint256 maxOperators);
    error AlreadyMember(uint256 jobId, address operator);
    error NotMember(uint256 jobId, address operator);
    error AlreadyLeaving(uint256 jobId, address operator);
    error PriceBelowAsk(uint256 price, uint256 ask);
    error AttestationRequired(uint256 jobId, address operator);
    error WrongEpoch(uint256 jobId, uint256 given, uint256 current);
    error DeadlinePassed(uint256 deadline, uint256 nowTs);
    error AlreadySubmitted(uint256 jobId, uint256 epoch, address operator);
    error ZeroCheckpoint();
    error ParticipationLength(uint256 given, uint256 expected);
    error ParticipationTooHigh(uint256 index, uint256 rounds, uint256 maxRounds);
    error EpochNotFinalizable(uint256 jobId, uint256 submitted, uint256 members, uint256 deadline);
    error UnknownJobKind(uint8 job);
    error UnsupportedPaymentAsset(address asset);
    error PaymentMismatch(uint256 declared, uint256 sent);
    error InvalidSlashPercent(uint256 percent);

    // ---------------------------------------------------------------- events

    event OperatorRegistered(address indexed operator, bytes32 peerKey, uint256 stake);
    event OperatorUpdated(address indexed operator, bytes32 peerKey, uint256 minPricePerEpoch);
    event OperatorDeregistered(address indexed operator);
    event AttestationSet(address indexed operator, bytes32 report, uint8 teeType, address verifier);
    event Staked(address indexed operator, address indexed account, uint256 amount, uint256 shares);
    event UnbondingQueued(address indexed operator, address indexed account, uint256 amount, uint64 unlockAt);
    event Unbonded(address indexed operator, address indexed account, uint256 amount);
    event RewardsClaimed(address indexed operator, address indexed account, uint256 amount);
    event JobCreated(uint256 indexed jobId, address indexed caller, Method method, uint256 escrow);
    event JobCancelled(uint256 indexed jobId, uint256 refund);
    event JoinRequested(uint256 indexed jobId, address indexed operator, uint256 effectiveEpoch);
    event LeaveRequested(uint256 indexed jobId, address indexed operator, uint256 effectiveEpoch);
    /// @dev The member list is read with `getMembers` (emitting it would cost the join that
    /// starts an epoch ~70k gas at the cap).
    event EpochStarted(
        uint256 indexed jobId,
        uint256 indexed epoch,
        uint64 attempt,
        uint256 memberCount,
        bytes32 startCheckpoint,
        uint64 deadline
    );
    event CheckpointSubmitted(
        uint256 indexed jobId, uint256 indexed epoch, address indexed operator, bytes32 checkpoint, bytes32 voteKey
    );
    event EpochFinalized(uint256 indexed jobId, uint256 indexed epoch, bytes32 checkpoint, uint256 paidMembers);
    event EpochFailed(uint256 indexed jobId, uint256 indexed epoch, uint256 failedEpochs);
    event OperatorPaid(uint256 indexed jobId, uint256 indexed epoch, address indexed operator, uint256 price);
    event Slashed(
        address indexed operator,
        uint256 indexed jobId,
        uint256 epoch,
        SlashReason reason,
        uint256 amount,
        address reporter
    );
    event JobCompleted(uint256 indexed jobId, bytes32 finalCheckpoint, uint256 refund);
    event JobFailed(uint256 indexed jobId, uint256 refund);
    event Credited(address indexed account, uint256 amount);
    event Withdrawn(address indexed account, uint256 amount);

    // ---------------------------------------------------------------- operators and stake

    /// @notice Registers the sender as an operator with `msg.value` as self-stake.
    /// @param peerKey Ed25519 public key of the node's libp2p identity; its peer id is the
    /// identity multihash `0x002408011220 || peerKey`. 32 bytes instead of the 38-byte id keep
    /// registration under 200k gas.
    /// @param multiaddrs libp2p addresses of the operator's node.
    /// @param hardware free-form description (e.g. "cpu:2", "gpu:a100x8").
    /// @param minPricePerEpoch lowest `pricePerOperatorEpoch` the operator accepts.
    function registerOperator(
        bytes32 peerKey,
        string[] calldata multiaddrs,
        string calldata hardware,
        uint256 minPricePerEpoch
    ) external payable;

    /// @notice Replaces the sender's peer key, addresses, hardware and price ask.
    function updateOperator(
        bytes32 peerKey,
        string[] calldata multiaddrs,
        string calldata hardware,
        uint256 minPricePerEpoch
    ) external;

    /// @notice Records a TEE attestation (report hash, TEE type, verifier) for the sender.
    function setAttestation(bytes32 report, uint8 teeType, address verifier) external;

    /// @notice Adds `msg.value` to the sender's self-stake.
    function stake() external payable;

    /// @notice Queues `amount` of self-stake for unbonding; the rest must stay >= minStake.
    function unstake(uint256 amount) external;

    /// @notice Deregisters the sender (no active jobs) and queues all self-stake for unbonding.
    function deregisterOperator() external;

    /// @notice Delegates `msg.value` to `operator`'s stake pool.
    function delegate(address operator) external payable;

    /// @notice Queues `amount` of the sender's delegation to `operator` for unbonding.
    function undelegate(address operator, uint256 amount) external;

    /// @notice Credits the sender's unbonded stake in `operator`'s pool once unlocked.
    /// Unbonding stake stays slashable until then.
    function withdrawUnbonded(address operator) external;

    /// @notice Credits the sender's staking rewards from `operator`'s pool.
    function claimRewards(address operator) external;

    /// @notice Sends the sender all its credits.
    function withdraw() external;

    // ---------------------------------------------------------------- jobs

    /// @notice Creates a job; `msg.value` must equal price x maxOperators x totalEpochs.
    function createJob(JobSpec calldata spec) external payable returns (uint256 jobId);

    /// @notice Cancels an `Open` job and credits its remaining escrow to the caller.
    function cancelJob(uint256 jobId) external;

    /// @notice Joins a job; takes effect at the next epoch boundary (or starts epoch 0).
    function joinJob(uint256 jobId) external;

    /// @notice Leaves a job at the next epoch boundary (immediately while the job is `Open`).
    function leaveJob(uint256 jobId) external;

    /// @notice Commits the sender's checkpoint hash for the epoch in progress.
    /// @param participation sync rounds applied from each member, in `getMembers` order.
    function submitCheckpoint(uint256 jobId, uint256 epoch, bytes32 checkpoint, uint32[] calldata participation)
        external;

    /// @notice Settles the epoch in progress (anyone; after all members submitted or the
    /// deadline). The sender earns `reporterBountyBps` of everything slashed from others.
    function finalizeEpoch(uint256 jobId, uint256 epoch) external;

    // ---------------------------------------------------------------- views

    function params() external view returns (Params memory);
    function nextJobId() external view returns (uint256);
    function getOperator(address operator) external view returns (OperatorInfo memory);
    function getPool(address operator) external view returns (PoolInfo memory);
    /// @notice Active stake of `account` in `operator`'s pool, in wei.
    function stakeOf(address operator, address account) external view returns (uint256);
    function sharesOf(address operator, address account) external view returns (uint256);
    /// @notice Unbonding stake (wei, after slashing so far) and its unlock time.
    function unbondingOf(address operator, address account) external view returns (uint256 amount, uint64 unlockAt);
    function pendingRewards(address operator, address account) external view returns (uint256);
    function creditOf(address account) external view returns (uint256);
    function getJob(uint256 jobId) external view returns (JobSpec memory spec, JobState memory state);
    /// @notice Members of the epoch in progress, in participation order (join order, with
    /// leavers compacted out at each boundary). Nodes sort a copy for shard assignment.
    function getMembers(uint256 jobId) external view returns (address[] memory);
    /// @notice Operators whose join takes effect at the next boundary.
    function getPendingJoins(uint256 jobId) external view returns (address[] memory);
    function isLeaving(uint256 jobId, address operator) external view returns (bool);
    /// @notice Finalized checkpoint of `epoch` (the start state of `epoch + 1`).
    function epochCheckpoint(uint256 jobId, uint256 epoch) external view returns (bytes32);
    /// @notice The sender's vote in the epoch in progress (zero when none).
    function submissionOf(uint256 jobId, address operator) external view returns (bytes32 checkpoint, bytes32 voteKey);
    function submittedCount(uint256 jobId) external view returns (uint256);
    function epochDeadline(uint256 jobId) external view returns (uint64);
    /// @notice Running totals whose sum equals the contract balance.
    function accounting()
        external
        view
        returns (uint256 staked, uint256 unbonding, uint256 escrow, uint256 credits, uint256 rewardReserve);
}
