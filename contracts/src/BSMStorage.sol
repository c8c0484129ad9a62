// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IDistributedTrainingBSMTypes} from "./interfaces/IDistributedTrainingBSM.sol";

/// @title BSMStorage
/// @notice The state of the BSM, shared by `DistributedTrainingBSM` and the read-only
/// extension `DistributedTrainingBSMViews` it delegates its views to (same layout in both).
abstract contract BSMStorage is IDistributedTrainingBSMTypes {
    uint256 internal constant _MAX_OPERATORS_CAP = 32;
    uint256 internal constant _MAX_SLASH_BPS = 5_000;
    uint256 internal constant _BPS = 10_000;
    uint256 internal constant _ACC = 1e18;

    enum Membership {
        None,
        Pending,
        Active,
        Leaving
    }

    struct Operator {
        bool registered;
        uint32 activeJobs;
        uint8 teeType;
        uint96 minPricePerEpoch;
        bytes32 attestationReport;
        address attestationVerifier;
        bytes32 peerKey;
        string[] multiaddrs;
        string hardware;
    }

    /// Staker rewards go to shares present for the whole epoch they are paid for. A deposit
    /// while the operator is in no job earns at once (every epoch it backs starts later);
    /// otherwise it is fresh: made in reward period k (`block.timestamp / rewardPeriod()`), it
    /// earns from the start of period k + 2. Earning shares = totalShares - freshA - freshB;
    /// at most two periods (k + 1, k + 2) hold fresh shares at a time: slots A and B.
    struct Pool {
        uint128 totalShares;
        uint128 totalAssets;
        uint128 unbondingShares;
        uint128 unbondingAssets;
        uint256 rewardPerShare;
        uint256 rewardReserve;
        uint128 freshA;
        uint64 periodA;
        uint128 freshB;
        uint64 periodB;
    }

    struct Position {
        uint128 shares; // all shares, fresh included
        uint128 freshShares; // not yet earning
        uint256 rewardPerSharePaid; // for the mature shares
        uint128 unbondingShares;
        uint64 unlockAt;
        uint64 freshPeriod; // period from which `freshShares` earn
    }

    struct Tally {
        uint8 submitted;
        uint8 leaderVotes;
        bytes32 leaderKey;
    }

    /// A distinct (checkpoint, participation) vote; `syncFailures` has bit i set when the
    /// participation shows member i below the sync threshold.
    struct Vote {
        bytes32 checkpoint;
        uint256 syncFailures;
    }

    /// An epoch settled in pieces (through the hooks): members settled so far and totals.
    struct Progress {
        uint8 cursor;
        uint8 paid;
        uint96 bounty;
        uint128 slashed;
    }

    Params internal _params;
    uint256 internal _nextJobId;
    uint64 internal _nextAttempt;

    mapping(address operator => Operator) internal _operators;
    mapping(address operator => Pool) internal _pools;
    mapping(address operator => mapping(address account => Position)) internal _positions;
    mapping(address account => uint256) internal _credits;

    uint256 internal _totalStaked;
    uint256 internal _totalUnbonding;
    uint256 internal _totalEscrow;
    uint256 internal _totalCredits;
    uint256 internal _totalRewardReserve;

    mapping(uint256 jobId => JobSpec) internal _specs;
    mapping(uint256 jobId => JobState) internal _jobs;
    mapping(uint256 jobId => address[]) internal _members;
    mapping(uint256 jobId => address[]) internal _pending;
    mapping(uint256 jobId => mapping(address operator => Membership)) internal _membership;
    mapping(uint256 jobId => mapping(uint256 epoch => bytes32)) internal _epochCheckpoints;

    mapping(uint64 attempt => Tally) internal _tallies;
    mapping(uint64 attempt => mapping(address operator => bytes32 voteKey)) internal _votesOf;
    mapping(uint64 attempt => mapping(bytes32 voteKey => uint8)) internal _voteCounts;
    mapping(uint64 attempt => mapping(bytes32 voteKey => Vote)) internal _voteData;
    mapping(address operator => mapping(uint64 period => uint256)) internal _maturedRps;
    mapping(uint256 jobId => Progress) internal _progress;
    /// Next nonce of each operator's EIP-712 signed hook calls.
    mapping(address operator => uint256) internal _nonces;

    function _assetsOf(address operator, address account) internal view returns (uint256) {
        Pool storage p = _pools[operator];
        if (p.totalShares == 0) return 0;
        return uint256(_positions[operator][account].shares) * p.totalAssets / p.totalShares;
    }

    function _period() internal view returns (uint64) {
        return uint64(block.timestamp / _rewardPeriod());
    }

    function _rewardPeriod() internal view returns (uint256) {
        return _params.unbondingPeriod / 2;
    }

    function _maxEpochDuration() internal view returns (uint256) {
        return _params.unbondingPeriod / 4 - _params.startGrace;
    }
}
