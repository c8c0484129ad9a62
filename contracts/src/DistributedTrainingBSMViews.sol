// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IDistributedTrainingBSMViews} from "./interfaces/IDistributedTrainingBSM.sol";
import {BSMStorage} from "./BSMStorage.sol";
import {TangleTypes} from "./interfaces/IBlueprintServiceManager.sol";

/// @title DistributedTrainingBSMViews
/// @notice The read-only half of the BSM. `DistributedTrainingBSM` deploys it in its
/// constructor and delegates every call it does not implement to it, so these functions run
/// on the BSM's storage; called directly, it reads its own empty state.
contract DistributedTrainingBSMViews is BSMStorage, IDistributedTrainingBSMViews {
    function params() external view returns (Params memory) {
        return _params;
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function nextJobId() external view returns (uint256) {
        return _nextJobId;
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function getOperator(address operator) external view returns (OperatorInfo memory info) {
        Operator storage o = _operators[operator];
        info = OperatorInfo({
            registered: o.registered,
            activeJobs: o.activeJobs,
            minPricePerEpoch: o.minPricePerEpoch,
            peerKey: o.peerKey,
            multiaddrs: o.multiaddrs,
            hardware: o.hardware,
            attestationReport: o.attestationReport,
            teeType: o.teeType,
            attestationVerifier: o.attestationVerifier
        });
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function getPool(address operator) external view returns (PoolInfo memory) {
        Pool storage p = _pools[operator];
        return
            PoolInfo(
                p.totalShares, p.totalAssets, p.unbondingShares, p.unbondingAssets, p.rewardPerShare, p.rewardReserve
            );
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function stakeOf(address operator, address account) external view returns (uint256) {
        return _assetsOf(operator, account);
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function sharesOf(address operator, address account) external view returns (uint256) {
        return _positions[operator][account].shares;
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function unbondingOf(address operator, address account) external view returns (uint256 amount, uint64 unlockAt) {
        Position storage pos = _positions[operator][account];
        Pool storage p = _pools[operator];
        if (pos.unbondingShares > 0) {
            amount = uint256(pos.unbondingShares) * p.unbondingAssets / p.unbondingShares;
        }
        unlockAt = pos.unlockAt;
    }

    function pendingRewards(address operator, address account) external view returns (uint256 earned) {
        Position storage pos = _positions[operator][account];
        Pool storage p = _pools[operator];
        uint256 rps = p.rewardPerShare;
        uint256 fresh = pos.freshShares;
        earned = (pos.shares - fresh) * (rps - pos.rewardPerSharePaid) / _ACC;
        uint64 fp = pos.freshPeriod;
        if (fresh > 0 && fp <= _period()) {
            // Matured: earns from the rate recorded when its slot rolled (now, if not yet).
            bool rolled = !(p.periodA == fp && p.freshA > 0) && !(p.periodB == fp && p.freshB > 0);
            earned += fresh * (rps - (rolled ? _maturedRps[operator][fp] : rps)) / _ACC;
        }
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function maxEpochDuration() external view returns (uint256) {
        return _maxEpochDuration();
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function rewardPeriod() external view returns (uint256) {
        return _rewardPeriod();
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function creditOf(address account) external view returns (uint256) {
        return _credits[account];
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function getJob(uint256 jobId) external view returns (JobSpec memory spec, JobState memory state) {
        return (_specs[jobId], _jobs[jobId]);
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function getMembers(uint256 jobId) external view returns (address[] memory) {
        return _members[jobId];
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function getPendingJoins(uint256 jobId) external view returns (address[] memory) {
        return _pending[jobId];
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function isLeaving(uint256 jobId, address operator) external view returns (bool) {
        return _membership[jobId][operator] == Membership.Leaving;
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function epochCheckpoint(uint256 jobId, uint256 epoch) external view returns (bytes32) {
        return _epochCheckpoints[jobId][epoch];
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function submissionOf(uint256 jobId, address operator) external view returns (bytes32 checkpoint, bytes32 voteKey) {
        JobState storage j = _jobs[jobId];
        if (j.status != JobStatus.Running) return (bytes32(0), bytes32(0));
        voteKey = _votesOf[j.attempt][operator];
        checkpoint = _voteData[j.attempt][voteKey].checkpoint;
        if (voteKey == bytes32(0)) checkpoint = bytes32(0);
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function submittedCount(uint256 jobId) external view returns (uint256) {
        JobState storage j = _jobs[jobId];
        if (j.status != JobStatus.Running) return 0;
        return _tallies[j.attempt].submitted;
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function epochDeadline(uint256 jobId) external view returns (uint64) {
        JobState storage j = _jobs[jobId];
        if (j.status != JobStatus.Running) return 0;
        return j.epochStart + _specs[jobId].epochDuration;
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function accounting()
        external
        view
        returns (uint256 staked, uint256 unbonding, uint256 escrow, uint256 credits, uint256 rewardReserve)
    {
        return (_totalStaked, _totalUnbonding, _totalEscrow, _totalCredits, _totalRewardReserve);
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function operatorNonce(address operator) external view returns (uint256) {
        return _nonces[operator];
    }

    // ---------------------------------------------------------------- Tangle hooks with no state
    // The rest of tnt-core's IBlueprintServiceManager: the core calls these best effort (or reads
    // them with a fallback to its defaults); this blueprint keeps no state for them.

    function onUpdatePreferences(address, bytes calldata) external payable {}

    function onApprove(address, uint64, uint8) external payable {}

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
