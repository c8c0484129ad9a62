// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";

import {IDistributedTrainingBSMTypes} from "./interfaces/IDistributedTrainingBSM.sol";

/// @title BSMStorage
/// @notice The state of the BSM, shared by `DistributedTrainingBSM` and the read-only
/// extension `DistributedTrainingBSMViews` it delegates its views to (same layout in both).
abstract contract BSMStorage is IDistributedTrainingBSMTypes {
    uint256 internal constant _MAX_OPERATORS_CAP = 32;
    uint256 internal constant _MAX_SLASH_BPS = 5_000;
    uint256 internal constant _BPS = 10_000;
    uint256 internal constant _ACC = 1e18;
    /// Token reward rates are kept at this scale: a reward of one unit of a 2-decimal token
    /// over a pool of 1e9 ether of shares still moves the rate (`_ACC` would round it to 0).
    uint256 internal constant _TOKEN_ACC = 1e36;
    /// The reserved vote for an epoch that cannot be done ("UNWORKABLE", left aligned).
    bytes32 internal constant _UNWORKABLE = "UNWORKABLE";
    /// Actions the hooks extension runs through `hookAction`: the Tangle job ids of
    /// `onJobCall` / `onJobResult`, then the other hooks that change state.
    uint8 internal constant _JOIN = 1;
    uint8 internal constant _LEAVE = 2;
    uint8 internal constant _COMMIT = 3;
    uint8 internal constant _REVEAL = 4;
    uint8 internal constant _FINALIZE = 5;
    uint8 internal constant _DEREGISTER = 0xf2;
    uint8 internal constant _SLASH = 0xf3;
    /// Members an epoch's settlement covers per hook call, under the core's 500k gas cap.
    uint256 internal constant _HOOK_SETTLE_BATCH = 2;
    /// Queued applicants an epoch boundary through the hooks seats at most (the rest wait for
    /// the next boundary): each seat costs ~37k gas.
    uint256 internal constant _HOOK_SEATS = 2;

    enum Membership {
        None,
        Pending,
        Active,
        Leaving
    }

    struct Operator {
        bool registered;
        uint32 activeJobs;
        uint96 minPricePerEpoch;
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
        uint8 committed;
        uint8 revealed;
        uint8 leaderVotes;
        uint64 revealedAt; // time of the latest reveal: the challenge window counts from it
        bytes32 leaderKey;
    }

    /// Bit `_MISSED_SHIFT + i` of a vote's `syncFailures`: member i is absent from a round.
    uint256 internal constant _MISSED_SHIFT = 128;

    /// A distinct (checkpoint, participation) vote; `syncFailures` has bit i set when the
    /// participation shows member i below the sync threshold.
    struct Vote {
        bytes32 checkpoint;
        uint256 syncFailures;
    }

    /// An epoch settled in pieces (through the hooks): members settled and paid so far, and
    /// what its finalizers earned.
    struct Progress {
        uint8 cursor;
        uint8 paid;
        uint96 bounty;
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
    mapping(uint64 attempt => mapping(address operator => bytes32 commitment)) internal _commitments;
    mapping(uint64 attempt => mapping(address operator => bytes32 voteKey)) internal _votesOf;
    mapping(uint64 attempt => mapping(bytes32 voteKey => uint8)) internal _voteCounts;
    mapping(uint64 attempt => mapping(bytes32 voteKey => Vote)) internal _voteData;
    mapping(address operator => mapping(uint64 period => uint256)) internal _maturedRps;
    mapping(uint256 jobId => Progress) internal _progress;
    /// Next nonce of each operator's EIP-712 signed hook calls.
    mapping(address operator => uint256) internal _nonces;
    /// Self-stake each operator has bonded for its seats (sum of its jobs' `seatBond`).
    mapping(address operator => uint256) internal _bonded;

    // ---------------------------------------------------------------- TEE attestation

    /// Most verifier contracts allowed at once.
    uint256 internal constant _MAX_ATTESTATION_VERIFIERS = 8;

    /// What an allowed verifier accepted for an operator (see `submitAttestation`).
    struct Attestation {
        address verifier;
        uint64 expiresAt;
        uint8 teeType;
        uint64 issuedAt;
        bytes32 measurement;
        bytes32 peerKey; // the operator's peer key when it was accepted
    }

    mapping(address operator => Attestation) internal _attestations;
    mapping(address verifier => bool) internal _attestationVerifiers;
    uint256 internal _attestationVerifierCount;

    function _setNetwork(
        Operator storage o,
        bytes32 peerKey,
        string[] memory multiaddrs,
        string memory hardware,
        uint256 minPricePerEpoch
    ) internal {
        o.peerKey = peerKey;
        o.multiaddrs = multiaddrs;
        o.hardware = hardware;
        o.minPricePerEpoch = SafeCast.toUint96(minPricePerEpoch);
    }

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
        Params storage p = _params;
        return p.unbondingPeriod / 4 - p.startGrace - p.revealWindow - 4 * uint256(p.challengeWindow);
    }

    /// Until when attempt `t` (of a job with `n` members whose reveals close at `closes`) may be
    /// challenged: `challengeWindow` after its last reveal once every member revealed, else
    /// after the reveal deadline.
    function _challengeCloses(Tally memory t, uint256 n, uint256 closes) internal view returns (uint256) {
        return (t.revealed == n ? t.revealedAt : closes) + _params.challengeWindow;
    }

    /// Takes `bps` of the pool's active and unbonding assets; returns the amount, which the
    /// caller must credit somewhere.
    function _slash(address operator, uint256 bps, uint256 jobId, uint256 epoch, SlashReason reason, address reporter)
        internal
        returns (uint256 amount)
    {
        Pool storage p = _pools[operator];
        uint256 active = uint256(p.totalAssets) * bps / _BPS;
        uint256 unbonding = uint256(p.unbondingAssets) * bps / _BPS;
        p.totalAssets -= SafeCast.toUint128(active);
        p.unbondingAssets -= SafeCast.toUint128(unbonding);
        _totalStaked -= active;
        _totalUnbonding -= unbonding;
        amount = active + unbonding;
        emit Slashed(operator, jobId, epoch, reason, amount, reporter);
    }

    function _credit(address account, uint256 amount) internal {
        _credits[account] += amount;
        _totalCredits += amount;
        emit Credited(account, amount);
    }

    /// Credits `amount` of `token` (address(0): ether) to `account`.
    function _creditIn(address token, address account, uint256 amount) internal {
        if (token == address(0)) return _credit(account, amount);
        _tokenCredits[token][account] += amount;
        _tokenTotals[token].credits += amount;
        emit TokenCredited(token, account, amount);
    }

    /// Validates `participation` against the member list and stores the vote on first sight
    /// in this attempt, judged by this job's spec: no other job can shape it.
    function _storeVote(uint256 jobId, uint64 attempt, bytes32 checkpoint, uint32[] memory participation)
        internal
        returns (bytes32 key)
    {
        uint256 n = _members[jobId].length;
        require(participation.length == n, ParticipationLength(participation.length, n));
        JobSpec storage spec = _specs[jobId];
        uint256 rounds = spec.stepsPerEpoch / spec.syncInterval;
        uint256 threshold = Math.mulDiv(rounds, _params.syncThresholdBps, _BPS, Math.Rounding.Ceil);
        uint256 syncFailures;
        for (uint256 i; i < n; ++i) {
            uint256 r = participation[i];
            require(r <= rounds, ParticipationTooHigh(i, r, rounds));
            if (r < threshold) syncFailures |= 1 << i;
            if (r < rounds) syncFailures |= 1 << (_MISSED_SHIFT + i);
        }
        key = keccak256(abi.encode(checkpoint, participation));
        Vote storage v = _voteData[attempt][key];
        if (v.checkpoint == bytes32(0)) (v.checkpoint, v.syncFailures) = (checkpoint, syncFailures);
    }

    function _commitmentHash(
        uint256 jobId,
        uint256 epoch,
        address operator,
        bytes32 checkpoint,
        uint32[] memory participation,
        bytes32 evidence,
        bytes32 salt
    ) internal pure returns (bytes32) {
        return keccak256(abi.encode(jobId, epoch, operator, checkpoint, participation, evidence, salt));
    }

    function _checkSpec(JobSpec memory spec) internal view {
        require(
            spec.minOperators >= 2 && spec.minOperators <= spec.maxOperators
                && spec.maxOperators <= _params.maxOperators,
            InvalidOperatorRange(spec.minOperators, spec.maxOperators, _params.maxOperators)
        );
        require(
            spec.totalEpochs > 0 && spec.syncInterval > 0 && spec.syncInterval <= spec.stepsPerEpoch,
            InvalidSchedule(spec.totalEpochs, spec.stepsPerEpoch, spec.syncInterval)
        );
        require(
            spec.topkPerChunk > 0 && (spec.quantBits == 1 || spec.quantBits == 2),
            InvalidCompression(spec.topkPerChunk, spec.quantBits)
        );
        uint256 maxDuration = _maxEpochDuration();
        require(
            spec.epochDuration >= _params.minEpochDuration && spec.epochDuration <= maxDuration,
            InvalidEpochDuration(spec.epochDuration, _params.minEpochDuration, maxDuration)
        );
        require(spec.pricePerOperatorEpoch > 0, ZeroValue());
        require(spec.seatBond >= _params.minSeatBond, SeatBondTooLow(spec.seatBond, _params.minSeatBond));
    }

    /// Records a new `Open` job of `caller` for a valid `spec`; the caller of this function
    /// books and collects its `escrow` (ether or a token).
    function _openJob(address caller, JobSpec memory spec) internal returns (uint256 jobId, uint256 escrow) {
        _checkSpec(spec);
        escrow = spec.pricePerOperatorEpoch * spec.maxOperators * spec.totalEpochs;
        jobId = _nextJobId++;
        _specs[jobId] = spec;
        JobState storage j = _jobs[jobId];
        j.caller = caller;
        j.status = JobStatus.Open;
        j.escrow = escrow;
        j.checkpoint = spec.modelHash;
        _refereePools[jobId] = RefereePool(uint48(block.number), uint32(_registry.length));
        emit JobCreated(jobId, caller, spec.method, escrow);
    }

    // ---------------------------------------------------------------- payment tokens
    // Jobs escrowed in an ERC-20 token: every amount of such a job is in its token, kept in
    // the per-token state below. Stake, slashes and bounties stay in ether.

    /// Distinct payment tokens ever allowed: bounds every per-token loop (a pool's claim).
    uint256 internal constant _MAX_PAYMENT_TOKENS = 4;

    /// `slot` = index in `_paymentTokens` + 1 (0: never allowed).
    struct PaymentToken {
        uint8 slot;
        bool allowed;
    }

    /// Running totals of one token; their sum is the BSM's balance of it.
    struct TokenTotals {
        uint256 escrow;
        uint256 credits;
        uint256 rewardReserve;
    }

    /// A stake pool's reward accumulator in one token (scale `_TOKEN_ACC`).
    struct TokenPool {
        uint256 rewardPerShare;
        uint256 rewardReserve;
    }

    address[] internal _paymentTokens;
    mapping(address token => PaymentToken) internal _tokenInfo;
    mapping(uint256 jobId => address token) internal _jobToken;
    mapping(address token => mapping(address account => uint256)) internal _tokenCredits;
    mapping(address token => TokenTotals) internal _tokenTotals;
    /// Bit i set: the pool has earned rewards in `_paymentTokens[i]`.
    mapping(address operator => uint256) internal _poolTokenMask;
    mapping(address operator => mapping(uint256 index => TokenPool)) internal _tokenPools;
    mapping(address operator => mapping(address account => mapping(uint256 index => uint256))) internal _tokenRpsPaid;
    /// Token rate + 1 that shares maturing at `period` earn from (0: never recorded).
    mapping(address operator => mapping(uint256 index => mapping(uint64 period => uint256))) internal _maturedTokenRps;

    // ---------------------------------------------------------------- equivocation
    /// Bit i set: member i of the attempt signed two different packets (or commitments) for
    /// one round; it is slashed at the fabrication rate and not paid when the attempt settles.
    mapping(uint64 attempt => uint256 members) internal _equivocators;

    // ---------------------------------------------------------------- challenges
    // Written by the views extension's challenge game (BSMChallenges); `_finalize` reads them.

    /// A challenge of one epoch attempt's certified vote.
    struct Challenge {
        address challenger;
        uint64 openedAt;
        uint8 drawn; // referees drawn (0: not drawn yet)
        uint8 committed;
        uint8 revealed;
        bool resolved;
        bytes32 transcript;
        bytes32 verdict; // vote key a majority of the drawn referees revealed
        uint256 findings; // that majority's: bit i member i consistent, bit 128 + i caught by replay
        // The referee draw's inputs, frozen when the challenge opened: the block whose hash
        // seeds it (0 once drawn), the registry's size and the largest draw weight then.
        uint64 seedBlock;
        uint48 weightsAt;
        uint32 registrySize;
        uint96 maxWeight;
        bool uncertified; // the attempt had no quorum: the referees settle it, or it is retried
    }

    /// Bit 128 + i of a verdict's findings: member i caught by replay.
    uint256 internal constant _CAUGHT_SHIFT = 128;

    /// Where a referee stands in a challenge.
    enum RefereeStep {
        None,
        Drawn,
        Committed,
        Revealed
    }

    mapping(uint64 attempt => Challenge) internal _challenges;
    mapping(uint64 attempt => address[]) internal _referees;
    mapping(uint64 attempt => mapping(address referee => RefereeStep)) internal _refereeSteps;
    mapping(uint64 attempt => mapping(address referee => bytes32)) internal _verdictCommitments;
    /// keccak256(abi.encode(voteKey, findings)) of each referee's revealed verdict.
    mapping(uint64 attempt => mapping(address referee => bytes32 verdict)) internal _verdictOf;
    mapping(uint64 attempt => mapping(bytes32 verdict => uint8)) internal _verdictCounts;

    // ---------------------------------------------------------------- seat draw
    // Scheduled by the BSM's `_join`, drawn by the hooks extension (BSMSeats).

    /// An applicant's weight in a seat draw is its self-stake up to this many `minStake`.
    uint256 internal constant _SEAT_WEIGHT_CAP = 10;

    /// When the seats of an `Open` job are drawn (0: fewer than `minOperators` applied).
    mapping(uint256 jobId => uint64) internal _seatDrawAt;

    function _seatWeight(address op) internal view returns (uint256) {
        return Math.min(_assetsOf(op, op), _SEAT_WEIGHT_CAP * _params.minStake);
    }

    /// Picks `want` of the entries weighted `w` (each at least 1) without replacement, from
    /// `seed`; zeroes the weight of each pick, so `w[i] == 0` marks the picked entries.
    function _drawByWeight(uint256[] memory w, uint256 want, uint256 seed) internal pure {
        uint256 total;
        for (uint256 i; i < w.length; ++i) {
            total += w[i];
        }
        for (uint256 k; k < want; ++k) {
            uint256 r = uint256(keccak256(abi.encode(seed, k))) % total;
            uint256 i;
            while (r >= w[i]) r -= w[i++];
            total -= w[i];
            w[i] = 0;
        }
    }

    // ---------------------------------------------------------------- membership

    function _openAttempt(uint256 jobId, JobState storage j) internal {
        uint64 attempt = _nextAttempt++;
        // A start grace after the start condition: nobody is slashed for time it did not have.
        uint64 start = uint64(block.timestamp) + _params.startGrace;
        j.status = JobStatus.Running;
        j.attempt = attempt;
        j.epochStart = start;
        emit EpochStarted(
            jobId, j.epoch, attempt, _members[jobId].length, j.checkpoint, start + _specs[jobId].epochDuration
        );
    }

    function _release(uint256 jobId, address op) internal {
        _membership[jobId][op] = Membership.None;
        _operators[op].activeJobs -= 1;
        _bonded[op] -= _specs[jobId].seatBond;
    }

    function _writeMembers(address[] storage list, address[] memory next, uint256 n) internal {
        uint256 old = list.length;
        for (uint256 i; i < n; ++i) {
            if (i < old) {
                if (list[i] != next[i]) list[i] = next[i];
            } else {
                list.push(next[i]);
            }
        }
        for (uint256 i = old; i > n; --i) {
            list.pop();
        }
    }

    function _removeFrom(address[] storage list, address op) internal {
        uint256 last = list.length - 1;
        for (uint256 i; i <= last; ++i) {
            if (list[i] == op) {
                if (i != last) list[i] = list[last];
                list.pop();
                return;
            }
        }
    }

    // ---------------------------------------------------------------- cancel at a boundary

    /// The caller asked its running job to end once the epoch in progress settles
    /// (`cancelJob`); `_finalize` then closes it `Cancelled` instead of starting the next epoch.
    mapping(uint256 jobId => bool) internal _cancelRequested;

    // ---------------------------------------------------------------- asks per payment unit

    /// Each operator's ask in each payment token, plus one (0: none set); its ask in ether is
    /// `Operator.minPricePerEpoch`.
    mapping(address operator => mapping(address token => uint256)) internal _tokenAsks;

    /// The least price in `token` (address(0): ether) `operator` takes a seat for. Without an
    /// ask in `token`, an operator asking nothing in ether takes any price in it and one asking
    /// something takes none (`takes` false): a price in ether says nothing about a token's.
    function _askIn(address operator, address token) internal view returns (bool takes, uint256 ask) {
        uint256 inEther = _operators[operator].minPricePerEpoch;
        if (token == address(0)) return (true, inEther);
        uint256 stored = _tokenAsks[operator][token];
        if (stored != 0) return (true, stored - 1);
        return (inEther == 0, 0);
    }

    // ---------------------------------------------------------------- referee registry
    // Referees are drawn from the operators registered when the job was created (the registry
    // only grows, so a job's index range is fixed by its size then), each accepted with
    // probability (the lesser of its draw weight then and at the challenge's block) / (the
    // largest draw weight at the challenge): weights and membership are read as they were
    // before the seed block existed.

    /// Who may judge a job: the first `registrySize` registry entries, those enlisted when the
    /// job was created, each weighed no heavier than it was at the end of block `createdAt`.
    /// Operators registered or stake added once a job exists cannot be drawn into its juries.
    struct RefereePool {
        uint48 createdAt;
        uint32 registrySize;
    }

    mapping(uint256 jobId => RefereePool) internal _refereePools;

    /// Tries per referee seat before a draw gives up (a jury smaller than `_minJury` decides
    /// nothing): bounds the draw's gas whatever the registry holds.
    uint256 internal constant _REFEREE_DRAW_TRIES = 64;

    address[] internal _registry;
    mapping(address operator => uint256) internal _registryIndex; // index + 1; 0: never registered

    /// A draw weight from block `fromBlock` on.
    struct WeightPoint {
        uint48 fromBlock;
        uint208 weight;
    }

    /// Each operator's draw weight by block number, oldest first: its self-stake capped like a
    /// seat weight, 0 while not registered.
    mapping(address operator => WeightPoint[]) internal _drawWeights;
    /// The largest draw weight any operator ever had (only grows).
    uint256 internal _maxDrawWeight;

    function _enlist(address op) internal {
        if (_registryIndex[op] == 0) {
            _registry.push(op);
            _registryIndex[op] = _registry.length;
        }
        _syncDrawWeight(op);
    }

    /// Records `op`'s draw weight as of this block (after every change of its self-stake,
    /// its pool's price or its registration).
    function _syncDrawWeight(address op) internal {
        if (_registryIndex[op] == 0) return;
        uint256 w = _operators[op].registered ? _seatWeight(op) : 0;
        WeightPoint[] storage points = _drawWeights[op];
        uint256 n = points.length;
        if (n > 0 && points[n - 1].weight == w) return;
        if (n > 0 && points[n - 1].fromBlock == block.number) {
            points[n - 1].weight = uint208(w);
        } else {
            points.push(WeightPoint(uint48(block.number), uint208(w)));
        }
        if (w > _maxDrawWeight) _maxDrawWeight = w;
    }

    /// `op`'s draw weight at the end of block `at` (0 before it registered).
    function _drawWeightAt(address op, uint256 at) internal view returns (uint256) {
        WeightPoint[] storage points = _drawWeights[op];
        uint256 hi = points.length;
        // Draws read recent blocks: the latest point usually answers at once.
        if (hi > 0 && points[hi - 1].fromBlock <= at) return points[hi - 1].weight;
        uint256 lo;
        while (lo < hi) {
            uint256 mid = (lo + hi) / 2;
            if (points[mid].fromBlock <= at) lo = mid + 1;
            else hi = mid;
        }
        return lo == 0 ? 0 : points[lo - 1].weight;
    }

    /// The block whose hash draws a sealed seat draw (0: not sealed).
    mapping(uint256 jobId => uint64) internal _seatSeedBlock;

    /// Members that announced their leave by the commit deadline of the attempt: silent
    /// after that, they said they could not finish (a slow host), which proves no dropout.
    mapping(uint64 attempt => mapping(address operator => bool)) internal _leftInTime;

    /// Least referees whose majority is a verdict: a majority of `refereeCount`.
    function _minJury() internal view returns (uint256) {
        return uint256(_params.refereeCount) / 2 + 1;
    }
}
