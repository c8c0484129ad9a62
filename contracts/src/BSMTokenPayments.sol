// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";

import {IDistributedTrainingBSMTokens} from "./interfaces/IDistributedTrainingBSM.sol";
import {BSMStorage} from "./BSMStorage.sol";

/// @title BSMTokenPayments
/// @notice Jobs priced and escrowed in an ERC-20 token (see IDistributedTrainingBSMTokens).
/// Part of the views extension, so it runs on the BSM's storage through the BSM's fallback;
/// the BSM itself settles token jobs' epochs (`_creditIn`, `_fromEscrow`, `_pay`). Its
/// reentrancy lock is the BSM's (ReentrancyGuard keeps it in one fixed storage slot), so a
/// token calling back during a transfer finds `withdraw`, `withdrawToken` and
/// `createJobWithToken` locked.
abstract contract BSMTokenPayments is BSMStorage, IDistributedTrainingBSMTokens, ReentrancyGuard {
    using SafeERC20 for IERC20;

    uint256 public constant MAX_PAYMENT_TOKENS = _MAX_PAYMENT_TOKENS;

    /// @inheritdoc IDistributedTrainingBSMTokens
    function createJobWithToken(JobSpec calldata spec, address token, address owner)
        external
        nonReentrant
        returns (uint256 jobId)
    {
        require(_tokenInfo[token].allowed, TokenNotAllowed(token));
        require(owner != address(0), ZeroOwner());
        uint256 escrow;
        (jobId, escrow) = _openJob(owner, spec);
        _jobToken[jobId] = token;
        _tokenTotals[token].escrow += escrow;
        emit JobEscrowedInToken(jobId, token, msg.sender, escrow);

        // Only what arrives counts: a fee on transfer, or a token that lies about moving it,
        // fails here, and nobody else's balance in the BSM can stand in for the payment.
        uint256 before = IERC20(token).balanceOf(address(this));
        IERC20(token).safeTransferFrom(msg.sender, address(this), escrow);
        uint256 afterwards = IERC20(token).balanceOf(address(this));
        uint256 received = afterwards > before ? afterwards - before : 0;
        require(received == escrow, WrongEscrow(escrow, received));
    }

    /// @inheritdoc IDistributedTrainingBSMTokens
    function setPaymentToken(address token, bool allowed) external {
        address developer = _params.developer;
        require(msg.sender == developer, NotDeveloper(msg.sender, developer));
        require(token.code.length > 0, NotAToken(token));
        PaymentToken storage t = _tokenInfo[token];
        if (t.slot == 0 && allowed) {
            uint256 n = _paymentTokens.length;
            require(n < _MAX_PAYMENT_TOKENS, TooManyPaymentTokens(n, _MAX_PAYMENT_TOKENS));
            _paymentTokens.push(token);
            t.slot = uint8(n + 1);
        }
        t.allowed = allowed;
        emit PaymentTokenSet(token, allowed);
    }

    /// @inheritdoc IDistributedTrainingBSMTokens
    function withdrawToken(address token) external nonReentrant {
        uint256 amount = _tokenCredits[token][msg.sender];
        require(amount > 0, NothingToWithdraw(msg.sender));
        _tokenCredits[token][msg.sender] = 0;
        _tokenTotals[token].credits -= amount;
        emit TokenWithdrawn(token, msg.sender, amount);
        IERC20(token).safeTransfer(msg.sender, amount);
    }

    /// @inheritdoc IDistributedTrainingBSMTokens
    function tokenCreditOf(address token, address account) external view returns (uint256) {
        return _tokenCredits[token][account];
    }

    /// @inheritdoc IDistributedTrainingBSMTokens
    function pendingTokenRewards(address token, address operator, address account)
        external
        view
        returns (uint256 earned)
    {
        uint256 slot = _tokenInfo[token].slot;
        if (slot == 0 || _poolTokenMask[operator] & (1 << (slot - 1)) == 0) return 0;
        uint256 i = slot - 1;
        Position storage pos = _positions[operator][account];
        Pool storage p = _pools[operator];
        uint256 rps = _tokenPools[operator][i].rewardPerShare;
        uint256 fresh = pos.freshShares;
        earned = (pos.shares - fresh) * (rps - _tokenRpsPaid[operator][account][i]) / _TOKEN_ACC;
        uint64 fp = pos.freshPeriod;
        if (fresh > 0 && fp <= _period()) {
            // Matured: earns from the rate recorded when its slot rolled (now, if not yet).
            bool rolled = !(p.periodA == fp && p.freshA > 0) && !(p.periodB == fp && p.freshB > 0);
            uint256 recorded = _maturedTokenRps[operator][i][fp]; // plus one; 0: never recorded
            earned += fresh * (rps - (rolled ? (recorded == 0 ? 0 : recorded - 1) : rps)) / _TOKEN_ACC;
        }
    }

    /// @inheritdoc IDistributedTrainingBSMTokens
    function tokenAccounting(address token)
        external
        view
        returns (uint256 escrow, uint256 credits, uint256 rewardReserve)
    {
        TokenTotals storage t = _tokenTotals[token];
        return (t.escrow, t.credits, t.rewardReserve);
    }

    /// @inheritdoc IDistributedTrainingBSMTokens
    function jobToken(uint256 jobId) external view returns (address) {
        return _jobToken[jobId];
    }

    /// @inheritdoc IDistributedTrainingBSMTokens
    function isPaymentToken(address token) external view returns (bool) {
        return _tokenInfo[token].allowed;
    }

    /// @inheritdoc IDistributedTrainingBSMTokens
    function paymentTokens() external view returns (address[] memory) {
        return _paymentTokens;
    }
}
