// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";

import {IDistributedTrainingBSMActions, IDistributedTrainingBSMViews} from "./interfaces/IDistributedTrainingBSM.sol";
import {BSMStorage} from "./BSMStorage.sol";

/// @title DistributedTrainingBSM
/// @notice Source of truth for who trains, on what, for how much, and who gets slashed.
/// @dev Stake pools are share based: slashing scales a pool's assets, never iterates stakers.
/// Staker rewards use a reward-per-share accumulator settled on every share change.
/// Every loop runs over one job's members or pending joins, bounded by `MAX_OPERATORS_CAP`.
contract DistributedTrainingBSM is BSMStorage, IDistributedTrainingBSMActions, ReentrancyGuard {
    using SafeCast for uint256;

    uint256 public constant MAX_OPERATORS_CAP = _MAX_OPERATORS_CAP;
    uint256 public constant MAX_SLASH_BPS = _MAX_SLASH_BPS;

    /// The read-only extension every unknown selector is delegated to (it delegates the
    /// Tangle hooks on to the hooks extension). Deployed before the BSM, which then fits the
    /// initcode limit; extensions hold no state, so one deployment serves every BSM of the
    /// same source.
    address private immutable _VIEWS;

    /// @param views a `DistributedTrainingBSMViews` deployed with the address of a
    /// `DistributedTrainingBSMHooks`, both from this BSM's source
    constructor(Params memory p, address views) {
        require(views.code.length > 0, ExtensionHasNoCode(views));
        uint256 sum = uint256(p.operatorBps) + p.stakerBps + p.protocolBps + p.developerBps;
        require(sum == _BPS, BpsSumNot10000(sum));
        require(p.fabricationSlashBps <= MAX_SLASH_BPS, SlashBpsTooHigh(p.fabricationSlashBps, MAX_SLASH_BPS));
        require(p.dropoutSlashBps <= MAX_SLASH_BPS, SlashBpsTooHigh(p.dropoutSlashBps, MAX_SLASH_BPS));
        require(p.syncFailSlashBps <= MAX_SLASH_BPS, SlashBpsTooHigh(p.syncFailSlashBps, MAX_SLASH_BPS));
        require(p.reporterBountyBps <= _BPS, BpsTooHigh(p.reporterBountyBps));
        require(p.syncThresholdBps <= _BPS, BpsTooHigh(p.syncThresholdBps));
        require(
            p.unworkableCompBps == 0 || p.unworkableCompBps < p.operatorBps,
            InvalidUnworkableComp(p.unworkableCompBps, p.operatorBps)
        );
        require(
            p.maxOperators > 0 && p.maxOperators <= MAX_OPERATORS_CAP,
            InvalidMaxOperators(p.maxOperators, MAX_OPERATORS_CAP)
        );
        require(p.maxFailedEpochs > 0, ZeroValue());
        require(p.minStake > 0, ZeroValue());
        require(p.minEpochDuration > 0 && p.revealWindow > 0 && p.openTimeout > 0, ZeroValue());
        require(p.minSeatBond > 0, ZeroValue());
        uint256 span = uint256(p.startGrace) + p.minEpochDuration + p.revealWindow;
        require(p.unbondingPeriod / 4 >= span, UnbondingTooShort(p.unbondingPeriod, 4 * span));
        require(p.treasury != address(0) && p.developer != address(0), ZeroAddress());
        _params = p;
        _nextJobId = 1;
        _nextAttempt = 1;
        _VIEWS = views;
    }

    /// Every view (see IDistributedTrainingBSMViews) runs in the extension on this storage.
    fallback() external {
        address views = _VIEWS;
        assembly ("memory-safe") {
            calldatacopy(0, 0, calldatasize())
            let ok := delegatecall(gas(), views, 0, calldatasize(), 0, 0)
            returndatacopy(0, 0, returndatasize())
            if iszero(ok) { revert(0, returndatasize()) }
            return(0, returndatasize())
        }
    }

    // ================================================================ operators and stake

    /// @inheritdoc IDistributedTrainingBSMActions
    function registerOperator(
        bytes32 peerKey,
        string[] calldata multiaddrs,
        string calldata hardware,
        uint256 minPricePerEpoch
    ) external payable {
        Operator storage o = _operators[msg.sender];
        require(!o.registered, AlreadyRegistered(msg.sender));
        require(msg.value >= _params.minStake, StakeBelowMinimum(msg.value, _params.minStake));
        o.registered = true;
        _setNetwork(o, peerKey, multiaddrs, hardware, minPricePerEpoch);
        _mint(msg.sender, msg.sender, msg.value);
        emit OperatorRegistered(msg.sender, peerKey, msg.value);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function updateOperator(
        bytes32 peerKey,
        string[] calldata multiaddrs,
        string calldata hardware,
        uint256 minPricePerEpoch
    ) external {
        Operator storage o = _operators[msg.sender];
        require(o.registered, NotRegistered(msg.sender));
        // An attestation binds the peer key: a new key voids it.
        if (peerKey != o.peerKey) delete _attestations[msg.sender];
        _setNetwork(o, peerKey, multiaddrs, hardware, minPricePerEpoch);
        emit OperatorUpdated(msg.sender, peerKey, minPricePerEpoch);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function stake() external payable {
        require(_operators[msg.sender].registered, NotRegistered(msg.sender));
        require(msg.value > 0, ZeroValue());
        _mint(msg.sender, msg.sender, msg.value);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function unstake(uint256 amount) external {
        _unstakeSelf(msg.sender, amount);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function deregisterOperator() external {
        _deregister(msg.sender);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function delegate(address operator) external payable {
        require(_operators[operator].registered, NotRegistered(operator));
        require(msg.value > 0, ZeroValue());
        _mint(operator, msg.sender, msg.value);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function undelegate(address operator, uint256 amount) external {
        if (msg.sender == operator && _operators[operator].registered) {
            _unstakeSelf(operator, amount);
        } else {
            _unbondAmount(operator, msg.sender, amount);
        }
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function withdrawUnbonded(address operator) external {
        Position storage pos = _positions[operator][msg.sender];
        uint256 shares = pos.unbondingShares;
        require(shares > 0, NothingUnbonding(operator, msg.sender));
        require(block.timestamp >= pos.unlockAt, StillUnbonding(pos.unlockAt, block.timestamp));
        Pool storage p = _pools[operator];
        uint256 amount = shares * p.unbondingAssets / p.unbondingShares;
        pos.unbondingShares = 0;
        pos.unlockAt = 0;
        p.unbondingShares -= shares.toUint128();
        p.unbondingAssets -= amount.toUint128();
        _totalUnbonding -= amount;
        if (p.unbondingShares == 0 && p.unbondingAssets > 0) {
            // Rounding dust nobody owns any more.
            uint256 dust = p.unbondingAssets;
            p.unbondingAssets = 0;
            _totalUnbonding -= dust;
            _credit(_params.treasury, dust);
        }
        _credit(msg.sender, amount);
        emit Unbonded(operator, msg.sender, amount);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function claimRewards(address operator) external {
        _settle(operator, msg.sender);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function withdraw() external nonReentrant {
        uint256 amount = _credits[msg.sender];
        require(amount > 0, NothingToWithdraw(msg.sender));
        _credits[msg.sender] = 0;
        _totalCredits -= amount;
        emit Withdrawn(msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        require(ok, TransferFailed(msg.sender, amount));
    }

    // ================================================================ jobs

    /// @inheritdoc IDistributedTrainingBSMActions
    function createJob(JobSpec calldata spec) external payable returns (uint256 jobId) {
        return _createJob(msg.sender, spec, msg.value);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function cancelJob(uint256 jobId) external {
        JobState storage j = _job(jobId);
        require(j.status == JobStatus.Open, JobNotOpen(jobId, j.status));
        if (msg.sender == j.caller) {
            uint256 refund = _close(jobId, JobStatus.Cancelled);
            emit JobCancelled(jobId, refund);
            return;
        }
        // A job that started and then lost its members waits `openTimeout` (unpaid) before
        // anyone may end it, so the escrow does not stay locked when the caller is gone.
        require(j.attempt != 0, NotJobCaller(msg.sender, j.caller));
        uint256 timeoutAt = uint256(j.epochStart) + _params.openTimeout;
        require(block.timestamp > timeoutAt, OpenTimeoutPending(jobId, timeoutAt, block.timestamp));
        emit JobFailed(jobId, _close(jobId, JobStatus.Failed));
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function joinJob(uint256 jobId) external {
        _join(jobId, msg.sender);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function leaveJob(uint256 jobId) external {
        _leave(jobId, msg.sender);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function commitCheckpoint(uint256 jobId, uint256 epoch, bytes32 commitment) external {
        _commit(jobId, msg.sender, epoch, commitment);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function revealCheckpoint(
        uint256 jobId,
        uint256 epoch,
        bytes32 checkpoint,
        uint32[] calldata participation,
        bytes32 salt
    ) external {
        _reveal(jobId, msg.sender, epoch, checkpoint, participation, salt);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function finalizeEpoch(uint256 jobId, uint256 epoch) external {
        _finalize(jobId, epoch, msg.sender, _MAX_OPERATORS_CAP);
    }

    /// @inheritdoc IDistributedTrainingBSMActions
    function hookAction(uint8 action, address operator, bytes calldata args) external {
        // Only the hooks extension, running as this contract after checking who `operator` is.
        require(msg.sender == address(this), OnlySelf(msg.sender));
        if (action == _JOIN) {
            _join(abi.decode(args, (uint256)), operator);
        } else if (action == _LEAVE) {
            _leave(abi.decode(args, (uint256)), operator);
        } else if (action == _COMMIT) {
            (uint256 jobId, uint256 epoch, bytes32 commitment) = abi.decode(args, (uint256, uint256, bytes32));
            _commit(jobId, operator, epoch, commitment);
        } else if (action == _REVEAL) {
            (uint256 jobId, uint256 epoch, bytes32 checkpoint, uint32[] memory participation, bytes32 salt) =
                abi.decode(args, (uint256, uint256, bytes32, uint32[], bytes32));
            _reveal(jobId, operator, epoch, checkpoint, participation, salt);
        } else if (action == _FINALIZE) {
            (uint256 jobId, uint256 epoch) = abi.decode(args, (uint256, uint256));
            _finalize(jobId, epoch, operator, _HOOK_SETTLE_BATCH);
        } else if (action == _DEREGISTER) {
            _deregister(operator);
        } else if (action == _SLASH) {
            uint256 amount = _slash(operator, abi.decode(args, (uint256)), 0, 0, SlashReason.External, _params.core);
            if (amount > 0) _credit(_params.treasury, amount);
        } else {
            revert UnknownJobKind(action);
        }
    }

    // ================================================================ internal: operators

    function _deregister(address operator) internal {
        Operator storage o = _operators[operator];
        require(o.registered, NotRegistered(operator));
        require(o.activeJobs == 0, OperatorHasActiveJobs(operator, o.activeJobs));
        o.registered = false;
        uint256 shares = _positions[operator][operator].shares;
        if (shares > 0) _unbondShares(operator, operator, shares);
        emit OperatorDeregistered(operator);
    }

    function _unstakeSelf(address operator, uint256 amount) internal {
        require(_operators[operator].registered, NotRegistered(operator));
        uint256 available = _assetsOf(operator, operator);
        require(amount > 0, ZeroValue());
        require(amount <= available, InsufficientStake(amount, available));
        _unbondAmount(operator, operator, amount);
        // Checked on what really remains after the share rounding: rounding cannot evict.
        uint256 remaining = _assetsOf(operator, operator);
        require(remaining >= _params.minStake, StakeBelowMinimum(remaining, _params.minStake));
        require(remaining >= _bonded[operator], StakeBonded(remaining, _bonded[operator]));
    }

    // ================================================================ internal: pools

    /// Share price never exceeds 1 (slashing lowers it, rounding favours the pool), so every
    /// positive deposit mints at least one share.
    function _mint(address operator, address account, uint256 amount) internal {
        _settle(operator, account);
        Pool storage p = _pools[operator];
        Position storage pos = _positions[operator][account];
        uint256 shares = p.totalShares == 0 ? amount : amount * p.totalShares / p.totalAssets;
        p.totalShares += shares.toUint128();
        p.totalAssets += amount.toUint128();
        pos.shares += shares.toUint128();
        _totalStaked += amount;
        if (_operators[operator].activeJobs == 0) {
            emit Staked(operator, account, amount, shares);
            return;
        }
        // New shares earn from the start of period k + 2; unmatured older ones wait with them.
        _roll(operator);
        uint64 target = _period() + 2;
        uint256 fresh = pos.freshShares;
        if (fresh > 0 && pos.freshPeriod != target) {
            _moveFresh(p, pos.freshPeriod, fresh, false);
            _moveFresh(p, target, fresh, true);
        }
        _moveFresh(p, target, shares, true);
        _prepareTokenSnapshots(operator, target);
        pos.freshShares = (fresh + shares).toUint128();
        pos.freshPeriod = target;
        emit Staked(operator, account, amount, shares);
    }

    /// Adds or removes `shares` fresh shares of `period` (one of at most two live slots).
    function _moveFresh(Pool storage p, uint64 period, uint256 shares, bool add) internal {
        uint128 s = shares.toUint128();
        if (p.freshA > 0 && p.periodA == period) {
            p.freshA = add ? p.freshA + s : p.freshA - s;
        } else if (p.freshB > 0 && p.periodB == period) {
            p.freshB = add ? p.freshB + s : p.freshB - s;
        } else if (p.freshA == 0) {
            (p.periodA, p.freshA) = (period, s);
        } else {
            (p.periodB, p.freshB) = (period, s);
        }
    }

    /// Empties the fresh slots whose period has begun (their shares now earn), recording the
    /// reward rate they start from.
    function _roll(address operator) internal {
        Pool storage p = _pools[operator];
        uint64 cur = _period();
        if (p.freshA > 0 && p.periodA <= cur) {
            _snapshotRps(operator, p.periodA, p.rewardPerShare);
            p.freshA = 0;
        }
        if (p.freshB > 0 && p.periodB <= cur) {
            _snapshotRps(operator, p.periodB, p.rewardPerShare);
            p.freshB = 0;
        }
    }

    /// Records the reward rates (ether and every token the pool earned in) that shares
    /// maturing at `period` earn from. Token rates are stored plus one (0: never recorded).
    function _snapshotRps(address operator, uint64 period, uint256 rps) internal {
        _maturedRps[operator][period] = rps;
        uint256 mask = _poolTokenMask[operator];
        for (uint256 i; mask != 0; ++i) {
            if (mask & 1 != 0) _maturedTokenRps[operator][i][period] = _tokenPools[operator][i].rewardPerShare + 1;
            mask >>= 1;
        }
    }

    /// The deposit that makes shares fresh until `period` pays for the storage of that period's
    /// token rates (a placeholder meaning rate 0), so the finalize that later records them
    /// rewrites slots instead of creating them.
    function _prepareTokenSnapshots(address operator, uint64 period) internal {
        uint256 mask = _poolTokenMask[operator];
        for (uint256 i; mask != 0; ++i) {
            if (mask & 1 != 0 && _maturedTokenRps[operator][i][period] == 0) _maturedTokenRps[operator][i][period] = 1;
            mask >>= 1;
        }
    }

    function _unbondAmount(address operator, address account, uint256 amount) internal {
        require(amount > 0, ZeroValue());
        uint256 available = _assetsOf(operator, account);
        require(amount <= available, InsufficientStake(amount, available));
        Pool storage p = _pools[operator];
        uint256 shares = Math.mulDiv(amount, p.totalShares, p.totalAssets, Math.Rounding.Ceil);
        _moveToUnbonding(operator, account, shares, amount);
    }

    function _unbondShares(address operator, address account, uint256 shares) internal {
        Pool storage p = _pools[operator];
        uint256 amount = shares * p.totalAssets / p.totalShares;
        _moveToUnbonding(operator, account, shares, amount);
    }

    function _moveToUnbonding(address operator, address account, uint256 shares, uint256 amount) internal {
        _settle(operator, account);
        Pool storage p = _pools[operator];
        Position storage pos = _positions[operator][account];
        // Fresh (not yet earning) shares leave first.
        uint256 fresh = Math.min(shares, pos.freshShares);
        if (fresh > 0) {
            _moveFresh(p, pos.freshPeriod, fresh, false);
            pos.freshShares -= fresh.toUint128();
        }
        pos.shares -= shares.toUint128();
        p.totalShares -= shares.toUint128();
        p.totalAssets -= amount.toUint128();
        _totalStaked -= amount;
        if (p.totalShares == 0 && p.totalAssets > 0) {
            uint256 dust = p.totalAssets;
            p.totalAssets = 0;
            _totalStaked -= dust;
            _credit(_params.treasury, dust);
        }
        if (amount == 0) return;
        uint256 ubShares = p.unbondingShares == 0 ? amount : amount * p.unbondingShares / p.unbondingAssets;
        p.unbondingShares += ubShares.toUint128();
        p.unbondingAssets += amount.toUint128();
        pos.unbondingShares += ubShares.toUint128();
        uint64 unlockAt = uint64(block.timestamp) + _params.unbondingPeriod;
        pos.unlockAt = unlockAt;
        _totalUnbonding += amount;
        emit UnbondingQueued(operator, account, amount, unlockAt);
    }

    function _settle(address operator, address account) internal {
        Pool storage p = _pools[operator];
        Position storage pos = _positions[operator][account];
        uint256 rps = p.rewardPerShare;
        uint256 fresh = pos.freshShares;
        uint256 matured;
        uint64 fp;
        if (fresh > 0) {
            fp = pos.freshPeriod;
            // Matured: its slot rolls (if it has not) so the pool counts these shares as earning.
            if (fp <= _period()) {
                matured = fresh;
                _roll(operator);
            }
        }
        uint256 mature = pos.shares - fresh;
        // An operator's own position holds no shares only when it registers, and its pool
        // earns nothing while it is not registered: its token rates are already current.
        if (fresh + mature > 0 || account != operator) {
            uint256 mask = _poolTokenMask[operator];
            for (uint256 i; mask != 0; ++i) {
                if (mask & 1 != 0) _settleToken(operator, account, i, mature, matured, fp);
                mask >>= 1;
            }
        }
        uint256 earned = mature * (rps - pos.rewardPerSharePaid) / _ACC;
        if (matured > 0) {
            earned += matured * (rps - _maturedRps[operator][fp]) / _ACC;
            pos.freshShares = 0;
        }
        if (pos.rewardPerSharePaid != rps) pos.rewardPerSharePaid = rps;
        if (earned == 0) return;
        p.rewardReserve -= earned;
        _totalRewardReserve -= earned;
        _credit(account, earned);
        emit RewardsClaimed(operator, account, earned);
    }

    /// `_settle` in the pool's token `i`: `mature` shares earn since they last settled,
    /// `matured` ones since their period `fp` began.
    function _settleToken(address operator, address account, uint256 i, uint256 mature, uint256 matured, uint64 fp)
        internal
    {
        TokenPool storage tp = _tokenPools[operator][i];
        uint256 rps = tp.rewardPerShare;
        uint256 paid = _tokenRpsPaid[operator][account][i];
        uint256 earned = mature * (rps - paid) / _TOKEN_ACC;
        if (matured > 0) {
            uint256 recorded = _maturedTokenRps[operator][i][fp];
            earned += matured * (rps - (recorded == 0 ? 0 : recorded - 1)) / _TOKEN_ACC;
        }
        if (paid != rps) _tokenRpsPaid[operator][account][i] = rps;
        if (earned == 0) return;
        address token = _paymentTokens[i];
        tp.rewardReserve -= earned;
        _tokenTotals[token].rewardReserve -= earned;
        _creditIn(token, account, earned);
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
        p.totalAssets -= active.toUint128();
        p.unbondingAssets -= unbonding.toUint128();
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

    // ================================================================ internal: jobs

    function _job(uint256 jobId) internal view returns (JobState storage j) {
        j = _jobs[jobId];
        require(j.status != JobStatus.None, UnknownJob(jobId));
    }

    function _createJob(address caller, JobSpec memory spec, uint256 value) internal returns (uint256 jobId) {
        uint256 escrow;
        (jobId, escrow) = _openJob(caller, spec);
        require(value == escrow, WrongEscrow(escrow, value));
        _totalEscrow += escrow;
    }

    function _join(uint256 jobId, address operator) internal {
        JobState storage j = _job(jobId);
        require(j.status == JobStatus.Open || j.status == JobStatus.Running, JobNotOpen(jobId, j.status));
        Operator storage o = _operators[operator];
        require(o.registered, NotRegistered(operator));
        require(_membership[jobId][operator] == Membership.None, AlreadyMember(jobId, operator));
        JobSpec storage spec = _specs[jobId];
        // Each seat bonds its own self-stake: stake backing one seat cannot back another.
        uint256 selfStake = _assetsOf(operator, operator);
        uint256 needed = Math.max(_params.minStake, _bonded[operator] + spec.seatBond);
        require(selfStake >= needed, InsufficientFreeStake(selfStake, needed));
        require(
            spec.pricePerOperatorEpoch >= o.minPricePerEpoch,
            PriceBelowAsk(spec.pricePerOperatorEpoch, o.minPricePerEpoch)
        );
        if (spec.teeRequired) _requireAttestation(jobId, operator);
        uint256 count = _members[jobId].length + _pending[jobId].length;
        require(count < spec.maxOperators, JobFull(jobId, count, spec.maxOperators));

        o.activeJobs += 1;
        _bonded[operator] += spec.seatBond;
        if (j.status == JobStatus.Running) {
            _membership[jobId][operator] = Membership.Pending;
            _pending[jobId].push(operator);
            emit JoinRequested(jobId, operator, j.epoch + 1);
        } else {
            // Nothing is in progress: the operator is a member of the epoch about to start.
            _membership[jobId][operator] = Membership.Active;
            _members[jobId].push(operator);
            emit JoinRequested(jobId, operator, j.epoch);
            if (count + 1 >= spec.minOperators) _openAttempt(jobId, j);
        }
    }

    /// The attestation is judged by the views extension (`attestationOf`), reached through this
    /// contract's own fallback; it counts only at join (see docs/contract.md).
    function _requireAttestation(uint256 jobId, address operator) internal view {
        (,, uint64 expiresAt,,,, bool valid) = IDistributedTrainingBSMViews(address(this)).attestationOf(operator);
        require(valid, AttestationRequired(jobId, operator, expiresAt, block.timestamp));
    }

    function _leave(uint256 jobId, address operator) internal {
        JobState storage j = _job(jobId);
        Membership m = _membership[jobId][operator];
        require(m != Membership.None, NotMember(jobId, operator));
        require(m != Membership.Leaving, AlreadyLeaving(jobId, operator));
        if (m == Membership.Pending) {
            _removeFrom(_pending[jobId], operator);
            _release(jobId, operator);
            emit LeaveRequested(jobId, operator, j.epoch);
        } else if (j.status == JobStatus.Running) {
            _membership[jobId][operator] = Membership.Leaving;
            emit LeaveRequested(jobId, operator, j.epoch + 1);
        } else {
            _removeFrom(_members[jobId], operator);
            _release(jobId, operator);
            emit LeaveRequested(jobId, operator, j.epoch);
        }
    }

    function _commit(uint256 jobId, address operator, uint256 epoch, bytes32 commitment) internal {
        JobState storage j = _running(jobId, epoch);
        Membership m = _membership[jobId][operator];
        require(m == Membership.Active || m == Membership.Leaving, NotMember(jobId, operator));
        uint256 deadline = j.epochStart + _specs[jobId].epochDuration;
        require(block.timestamp <= deadline, DeadlinePassed(deadline, block.timestamp));
        uint64 attempt = j.attempt;
        require(_commitments[attempt][operator] == bytes32(0), AlreadyCommitted(jobId, epoch, operator));
        require(commitment != bytes32(0), ZeroCheckpoint());
        _commitments[attempt][operator] = commitment;
        _tallies[attempt].committed += 1;
        emit CheckpointCommitted(jobId, epoch, operator, commitment);
    }

    /// Reveals open only when nobody can commit any more (deadline passed or everyone
    /// committed), so no vote can be copied; the commitment binds the operator's address.
    function _reveal(
        uint256 jobId,
        address operator,
        uint256 epoch,
        bytes32 checkpoint,
        uint32[] memory participation,
        bytes32 salt
    ) internal {
        JobState storage j = _running(jobId, epoch);
        uint64 attempt = j.attempt;
        bytes32 commitment = _commitments[attempt][operator];
        require(commitment != bytes32(0), NotCommitted(jobId, epoch, operator));
        require(_votesOf[attempt][operator] == bytes32(0), AlreadyRevealed(jobId, epoch, operator));
        require(
            _commitmentHash(jobId, epoch, operator, checkpoint, participation, salt) == commitment,
            CommitmentMismatch(jobId, operator)
        );
        Tally storage t = _tallies[attempt];
        uint256 deadline = j.epochStart + _specs[jobId].epochDuration;
        require(
            block.timestamp > deadline || t.committed == _members[jobId].length,
            RevealNotOpen(deadline, block.timestamp)
        );
        uint256 closes = deadline + _params.revealWindow;
        require(block.timestamp <= closes, RevealClosed(closes, block.timestamp));
        require(checkpoint != bytes32(0), ZeroCheckpoint());

        // Every UNWORKABLE vote is the same vote, whatever participation came with it.
        bytes32 key = checkpoint == _UNWORKABLE ? _UNWORKABLE : _storeVote(jobId, attempt, checkpoint, participation);
        _votesOf[attempt][operator] = key;
        uint8 votes = ++_voteCounts[attempt][key];
        t.revealed += 1;
        if (votes > t.leaderVotes) {
            t.leaderVotes = votes;
            if (t.leaderKey != key) t.leaderKey = key;
        }
        emit CheckpointRevealed(jobId, epoch, operator, checkpoint, key);
    }

    function _running(uint256 jobId, uint256 epoch) internal view returns (JobState storage j) {
        j = _job(jobId);
        require(j.status == JobStatus.Running, JobNotRunning(jobId, j.status));
        require(epoch == j.epoch, WrongEpoch(jobId, epoch, j.epoch));
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
        }
        key = keccak256(abi.encode(checkpoint, participation));
        Vote storage v = _voteData[attempt][key];
        if (v.checkpoint == bytes32(0)) (v.checkpoint, v.syncFailures) = (checkpoint, syncFailures);
    }

    /// Per-epoch settlement context; a struct keeps the settle loop within the stack limit.
    struct Settlement {
        uint256 jobId;
        uint256 epoch;
        address reporter;
        uint64 attempt;
        bool quorum;
        bool unworkable; // the quorum voted UNWORKABLE: compensate its voters, slash nobody
        bytes32 leaderKey;
        uint256 syncFailures;
        uint256 price;
        uint256 paid; // members paid (or compensated, when unworkable)
        uint256 slashed;
        bool stakersLate; // finalized more than a reward period after the epoch began
        address token; // the job's payment token; address(0): ether
        uint256 equivocators; // bit i: member i proven to equivocate (reportEquivocation)
    }

    /// Settles members `[cursor, cursor + maxMembers)` of the epoch; the call that settles the
    /// last one also ends the epoch. A hook settles in pieces to stay under the core's gas cap,
    /// and ends the epoch in one more call.
    function _finalize(uint256 jobId, uint256 epoch, address reporter, uint256 maxMembers) internal {
        JobState storage j = _running(jobId, epoch);
        JobSpec storage spec = _specs[jobId];
        address[] memory members = _members[jobId];
        Tally memory t = _tallies[j.attempt];
        uint256 closes = j.epochStart + spec.epochDuration + _params.revealWindow;
        require(
            t.revealed == members.length || block.timestamp > closes,
            EpochNotFinalizable(jobId, t.revealed, members.length, closes)
        );
        Settlement memory c;
        c.jobId = jobId;
        c.epoch = epoch;
        c.reporter = reporter;
        c.attempt = j.attempt;
        c.quorum = t.leaderVotes > 0 && uint256(t.leaderVotes) * 3 >= members.length * 2;
        c.leaderKey = t.leaderKey;
        c.unworkable = c.quorum && t.leaderKey == _UNWORKABLE;
        c.price =
            c.unworkable ? spec.pricePerOperatorEpoch * _params.unworkableCompBps / _BPS : spec.pricePerOperatorEpoch;
        c.stakersLate = block.timestamp > j.epochStart - _params.startGrace + _rewardPeriod();
        c.token = _jobToken[jobId];
        Vote memory v = c.quorum ? _voteData[c.attempt][t.leaderKey] : Vote(bytes32(0), 0);
        c.syncFailures = v.syncFailures;
        c.equivocators = _equivocators[c.attempt];
        Progress memory g = _progress[jobId];
        uint256 to = Math.min(members.length, g.cursor + maxMembers);
        bool inPieces = maxMembers == _HOOK_SETTLE_BATCH;
        bool closing = c.unworkable
            || (c.quorum ? j.epoch + 1 == spec.totalEpochs : j.failedEpochs + 1 >= _params.maxFailedEpochs);
        for (uint256 i = g.cursor; i < to; ++i) {
            address op = members[i];
            _settleMember(c, op, i);
            // In pieces, a member that leaves at this boundary is released as it is settled,
            // so the call that ends the epoch reads no member's stake.
            if (inPieces && (closing || _membership[jobId][op] != Membership.Active || !_stays(op))) {
                _release(jobId, op);
            }
        }
        if (c.paid > 0) {
            if (c.unworkable) _fromEscrow(j, c.price * c.paid, c.token);
            else g.bounty += _payShared(c, j, g.bounty).toUint96();
        }
        // Slashed stake goes to the treasury, all of it: nobody earns from a slash.
        if (c.slashed > 0) _credit(_params.treasury, c.slashed);
        c.paid += g.paid;
        // Through the hooks, the epoch's end (roster and next attempt) is a call of its own.
        if (to < members.length || (maxMembers == _HOOK_SETTLE_BATCH && to > g.cursor)) {
            (g.cursor, g.paid) = (uint8(to), uint8(c.paid));
            _progress[jobId] = g;
            emit EpochSettling(jobId, epoch, to, members.length);
            return;
        }
        if (g.cursor > 0) delete _progress[jobId];

        if (c.unworkable) {
            uint256 refund = _close(jobId, JobStatus.Failed);
            emit JobAborted(jobId, epoch, c.paid, c.price, refund);
            return;
        }
        if (c.quorum) {
            _epochCheckpoints[jobId][epoch] = v.checkpoint;
            j.checkpoint = v.checkpoint;
            j.epoch += 1;
            j.failedEpochs = 0;
            emit EpochFinalized(jobId, epoch, v.checkpoint, c.paid);
            if (j.epoch == spec.totalEpochs) {
                uint256 refund = _close(jobId, JobStatus.Completed);
                emit JobCompleted(jobId, v.checkpoint, refund);
                return;
            }
        } else {
            j.failedEpochs += 1;
            emit EpochFailed(jobId, epoch, j.failedEpochs);
            if (j.failedEpochs >= _params.maxFailedEpochs) {
                uint256 refund = _close(jobId, JobStatus.Failed);
                emit JobFailed(jobId, refund);
                return;
            }
        }
        _startEpoch(jobId, inPieces);
    }

    /// Pays, slashes or skips member `i`. A silent member is slashed even without quorum (it
    /// is provably offline); mismatch and sync failure need a quorum to be judged against.
    function _settleMember(Settlement memory c, address op, uint256 i) internal {
        bytes32 key = _votesOf[c.attempt][op];
        if (c.equivocators & (1 << i) != 0) {
            // Signed two packets for one round: provably dishonest, whatever it voted.
            c.slashed += _slashMember(c, op, _params.fabricationSlashBps, SlashReason.Equivocation);
        } else if (c.unworkable) {
            if (key == _UNWORKABLE) {
                _creditIn(c.token, op, c.price);
                c.paid += 1;
            }
        } else if (key == bytes32(0) && _commitments[c.attempt][op] != bytes32(0)) {
            // Committed, then kept its vote back once it could see the others': a losing vote
            // withheld must cost what a losing vote revealed costs.
            c.slashed += _slashMember(c, op, _params.fabricationSlashBps, SlashReason.WithheldReveal);
        } else if (key == bytes32(0) || (c.quorum && key == _UNWORKABLE)) {
            // Silent, or could not work while a quorum could: did no work, fabricated nothing.
            c.slashed += _slashMember(c, op, _params.dropoutSlashBps, SlashReason.Dropout);
        } else if (!c.quorum) {
            return;
        } else if (key != c.leaderKey) {
            c.slashed += _slashMember(c, op, _params.fabricationSlashBps, SlashReason.Fabrication);
        } else if (c.syncFailures & (1 << i) != 0) {
            c.slashed += _slashMember(c, op, _params.syncFailSlashBps, SlashReason.SyncFailure);
        } else {
            _pay(c, op);
            c.paid += 1;
        }
    }

    function _slashMember(Settlement memory c, address op, uint256 bps, SlashReason reason) internal returns (uint256) {
        // A slashed member leaves the job at this boundary.
        _membership[c.jobId][op] = Membership.Leaving;
        return _slash(op, bps, c.jobId, c.epoch, reason, c.reporter);
    }

    /// Operator share and stake-pool share of one paid operator-epoch.
    /// The stake-pool share goes to the pool's shares present for the whole epoch (mature
    /// ones); with none, or when the epoch was finalized too late to tell, to the treasury.
    function _pay(Settlement memory c, address op) internal {
        uint256 price = c.price;
        address token = c.token;
        _creditIn(token, op, price * _params.operatorBps / _BPS);
        uint256 stakerCut = price * _params.stakerBps / _BPS;
        _roll(op);
        Pool storage p = _pools[op];
        uint256 earning = uint256(p.totalShares) - p.freshA - p.freshB;
        if (earning == 0 || c.stakersLate) {
            _creditIn(token, _params.treasury, stakerCut);
        } else if (token == address(0)) {
            p.rewardPerShare += stakerCut * _ACC / earning;
            p.rewardReserve += stakerCut;
            _totalRewardReserve += stakerCut;
        } else {
            // The pool's accumulator in this token; its bit lets claims find it.
            uint256 i = _tokenInfo[token].slot - 1;
            TokenPool storage tp = _tokenPools[op][i];
            tp.rewardPerShare += stakerCut * _TOKEN_ACC / earning;
            tp.rewardReserve += stakerCut;
            _tokenTotals[token].rewardReserve += stakerCut;
            _poolTokenMask[op] |= 1 << i;
        }
        emit OperatorPaid(c.jobId, c.epoch, op, price);
    }

    /// Developer and protocol shares of `paid` operator-epochs; rounding dust to the treasury.
    /// A finalizer that is neither the caller nor in the job earns `reporterBountyBps` of the
    /// protocol's share, the epoch's calls together at most `maxReporterBounty` (`before`: what
    /// its earlier calls earned); returns what this call's finalizer earned.
    function _payShared(Settlement memory c, JobState storage j, uint256 before) internal returns (uint256 bounty) {
        (uint256 price, uint256 paid) = (c.price, c.paid);
        uint256 developerCut = price * _params.developerBps / _BPS;
        uint256 memberCut = price * _params.operatorBps / _BPS + price * _params.stakerBps / _BPS;
        uint256 protocol = (price - memberCut - developerCut) * paid;
        address to = c.reporter;
        if (to != j.caller && to != _params.treasury && _membership[c.jobId][to] == Membership.None) {
            uint256 cap = _params.maxReporterBounty;
            bounty = Math.min(protocol * _params.reporterBountyBps / _BPS, cap - Math.min(cap, before));
            if (bounty > 0) {
                _creditIn(c.token, to, bounty);
                emit FinalizerPaid(c.jobId, c.epoch, to, bounty);
            }
        }
        _creditIn(c.token, _params.developer, developerCut * paid);
        _creditIn(c.token, _params.treasury, protocol - bounty);
        _fromEscrow(j, price * paid, c.token);
    }

    /// Takes `amount` out of job escrow `j`, held in `token` (address(0): ether).
    function _fromEscrow(JobState storage j, uint256 amount, address token) internal {
        j.escrow -= amount;
        if (token == address(0)) _totalEscrow -= amount;
        else _tokenTotals[token].escrow -= amount;
    }

    /// Applies leaves and joins at an epoch boundary and starts the next epoch, or leaves the
    /// job `Open` until enough operators join. `checked`: every member's stake was judged as it
    /// was settled (in pieces), and those leaving were released then.
    function _startEpoch(uint256 jobId, bool checked) internal {
        JobState storage j = _jobs[jobId];
        address[] storage current = _members[jobId];
        address[] storage pending = _pending[jobId];
        address[] memory next = new address[](current.length + pending.length);
        uint256 n;
        for (uint256 i; i < current.length; ++i) {
            address op = current[i];
            Membership m = _membership[jobId][op];
            if (m == Membership.Active && (checked || _stays(op))) {
                next[n++] = op;
            } else if (m == Membership.Active || m == Membership.Leaving) {
                _release(jobId, op);
            }
            // None or Pending: released as it was settled (and perhaps queued again since).
        }
        for (uint256 i; i < pending.length; ++i) {
            address op = pending[i];
            _membership[jobId][op] = Membership.Active;
            next[n++] = op;
        }
        delete _pending[jobId];
        _writeMembers(current, next, n);
        // Every epoch needs minOperators (>= 2) members: nobody certifies its own checkpoint.
        if (n >= _specs[jobId].minOperators) {
            _openAttempt(jobId, j);
        } else {
            j.status = JobStatus.Open;
            j.epochStart = uint64(block.timestamp); // waiting since: `openTimeout` runs from here
        }
    }

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

    /// A member stays while it is registered and its self-stake still covers the minimum and
    /// every seat bond.
    function _stays(address op) internal view returns (bool) {
        return _operators[op].registered && _assetsOf(op, op) >= Math.max(_params.minStake, _bonded[op]);
    }

    /// Ends a job: releases every member and pending joiner and refunds unearned escrow.
    function _close(uint256 jobId, JobStatus status) internal returns (uint256 refund) {
        JobState storage j = _jobs[jobId];
        j.status = status;
        address[] storage current = _members[jobId];
        for (uint256 i; i < current.length; ++i) {
            Membership m = _membership[jobId][current[i]];
            // None or Pending: released as it was settled in pieces (Pending: queued again).
            if (m == Membership.Active || m == Membership.Leaving) _release(jobId, current[i]);
        }
        address[] storage pending = _pending[jobId];
        for (uint256 i; i < pending.length; ++i) {
            _release(jobId, pending[i]);
        }
        delete _members[jobId];
        delete _pending[jobId];
        refund = j.escrow;
        if (refund > 0) {
            address token = _jobToken[jobId];
            _fromEscrow(j, refund, token);
            _creditIn(token, j.caller, refund);
        }
    }

    function _release(uint256 jobId, address op) internal {
        _membership[jobId][op] = Membership.None;
        _operators[op].activeJobs -= 1;
        _bonded[op] -= _specs[jobId].seatBond;
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
}
