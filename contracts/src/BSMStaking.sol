// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";

import {IDistributedTrainingBSMStaking} from "./interfaces/IDistributedTrainingBSM.sol";
import {BSMStorage} from "./BSMStorage.sol";

/// @title BSMStaking
/// @notice Stake pools: share based (slashing scales a pool's assets, never iterates stakers),
/// with a reward-per-share accumulator settled on every share change. The BSM settles and
/// pays through these; the entry points are BSMStakingActions, in the hooks extension.
abstract contract BSMStaking is BSMStorage {
    using SafeCast for uint256;

    function _deregister(address operator) internal {
        Operator storage o = _operators[operator];
        require(o.registered, NotRegistered(operator));
        require(o.activeJobs == 0, OperatorHasActiveJobs(operator, o.activeJobs));
        o.registered = false;
        uint256 shares = _positions[operator][operator].shares;
        if (shares > 0) _unbondShares(operator, operator, shares);
        _syncDrawWeight(operator);
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
        if (account == operator) _syncDrawWeight(operator);
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
        if (account == operator) _syncDrawWeight(operator);
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
}

/// @title BSMStakingActions
/// @notice IDistributedTrainingBSMStaking: registration, stake, delegation, unbonding and reward
/// claims. Part of the hooks extension (the BSM has no room for them); reached through the BSM's
/// and the views extension's fallbacks, it runs on the BSM's storage.
abstract contract BSMStakingActions is BSMStaking, IDistributedTrainingBSMStaking {
    using SafeCast for uint256;

    /// @inheritdoc IDistributedTrainingBSMStaking
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
        _enlist(msg.sender);
        emit OperatorRegistered(msg.sender, peerKey, msg.value);
    }

    /// @inheritdoc IDistributedTrainingBSMStaking
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

    /// @inheritdoc IDistributedTrainingBSMStaking
    function updateAsk(address token, uint256 ask) external {
        Operator storage o = _operators[msg.sender];
        require(o.registered, NotRegistered(msg.sender));
        if (token == address(0)) {
            o.minPricePerEpoch = ask.toUint96();
        } else {
            require(_tokenInfo[token].allowed, TokenNotAllowed(token));
            _tokenAsks[msg.sender][token] = uint256(ask.toUint248()) + 1;
        }
        emit AskUpdated(msg.sender, token, ask);
    }

    /// @inheritdoc IDistributedTrainingBSMStaking
    function askIn(address operator, address token) external view returns (bool takes, uint256 ask) {
        return _askIn(operator, token);
    }

    /// @inheritdoc IDistributedTrainingBSMStaking
    function stake() external payable {
        require(_operators[msg.sender].registered, NotRegistered(msg.sender));
        require(msg.value > 0, ZeroValue());
        _mint(msg.sender, msg.sender, msg.value);
    }

    /// @inheritdoc IDistributedTrainingBSMStaking
    function unstake(uint256 amount) external {
        _unstakeSelf(msg.sender, amount);
    }

    /// @inheritdoc IDistributedTrainingBSMStaking
    function deregisterOperator() external {
        _deregister(msg.sender);
    }

    /// @inheritdoc IDistributedTrainingBSMStaking
    function delegate(address operator) external payable {
        require(_operators[operator].registered, NotRegistered(operator));
        require(msg.value > 0, ZeroValue());
        _mint(operator, msg.sender, msg.value);
    }

    /// @inheritdoc IDistributedTrainingBSMStaking
    function undelegate(address operator, uint256 amount) external {
        if (msg.sender == operator && _operators[operator].registered) {
            _unstakeSelf(operator, amount);
        } else {
            _unbondAmount(operator, msg.sender, amount);
        }
    }

    /// @inheritdoc IDistributedTrainingBSMStaking
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

    /// @inheritdoc IDistributedTrainingBSMStaking
    function claimRewards(address operator) external {
        _settle(operator, msg.sender);
    }
}
