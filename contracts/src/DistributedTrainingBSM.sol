// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";

import {
    IDistributedTrainingBSMActions,
    IDistributedTrainingBSMSeats,
    IDistributedTrainingBSMViews
} from "./interfaces/IDistributedTrainingBSM.sol";
import {BSMStaking} from "./BSMStaking.sol";

/// @title DistributedTrainingBSM
/// @notice Source of truth for who trains, on what, for how much, and who gets slashed.
/// @dev Stake pools are share based: slashing scales a pool's assets, never iterates stakers.
/// Staker rewards use a reward-per-share accumulator settled on every share change.
/// Every loop runs over one job's members or pending joins, bounded by `MAX_OPERATORS_CAP`.
contract DistributedTrainingBSM is BSMStaking, IDistributedTrainingBSMActions, ReentrancyGuard {
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
        require(
            p.challengeWindow == 0
                || (p.refereeCount % 2 == 1 && p.refereeCount < MAX_OPERATORS_CAP && p.challengeBond > 0),
            InvalidChallengeParams(p.refereeCount, p.challengeBond)
        );
        uint256 span = uint256(p.startGrace) + p.minEpochDuration + p.revealWindow + 4 * uint256(p.challengeWindow);
        require(p.unbondingPeriod / 4 >= span, UnbondingTooShort(p.unbondingPeriod, 4 * span));
        require(p.treasury != address(0) && p.developer != address(0), ZeroAddress());
        // Without a challenge window or a seat draw, a certified vote is final at once and the
        // first joiners own the seats: only development chains may run so.
        require(
            (p.challengeWindow > 0 && p.seatDrawWindow > 0) || block.chainid == 31_337 || block.chainid == 1337,
            TrustSwitchedOff(block.chainid, p.challengeWindow, p.seatDrawWindow)
        );
        _params = p;
        _nextJobId = 1;
        _nextAttempt = 1;
        _VIEWS = views;
    }

    /// Every view (see IDistributedTrainingBSMViews) runs in the extension on this storage, and
    /// so does the challenge game, whose bond is ether.
    fallback() external payable {
        address views = _VIEWS;
        assembly ("memory-safe") {
            calldatacopy(0, 0, calldatasize())
            let ok := delegatecall(gas(), views, 0, calldatasize(), 0, 0)
            returndatacopy(0, 0, returndatasize())
            if iszero(ok) { revert(0, returndatasize()) }
            return(0, returndatasize())
        }
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
        if (j.status == JobStatus.Running) {
            // Ends at the epoch's boundary: the epoch in progress is settled (paid) as usual.
            require(msg.sender == j.caller, NotJobCaller(msg.sender, j.caller));
            require(!_cancelRequested[jobId], CancelAlreadyRequested(jobId, j.epoch));
            // Half settled through the hooks: the members settled so far stay bonded, and the
            // call ending the epoch must not release them all under the hook gas cap.
            require(_progress[jobId].cursor == 0, SettlementInProgress(jobId, j.epoch));
            _cancelRequested[jobId] = true;
            emit CancelRequested(jobId, j.epoch);
            return;
        }
        require(j.status == JobStatus.Open, JobEnded(jobId, j.status));
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
        bytes32 transcript,
        bytes32 salt
    ) external {
        _reveal(jobId, msg.sender, epoch, checkpoint, participation, transcript, salt);
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
            (uint256 jobId, uint256 epoch, bytes32 checkpoint, uint32[] memory p, bytes32 transcript, bytes32 salt) =
                abi.decode(args, (uint256, uint256, bytes32, uint32[], bytes32, bytes32));
            _reveal(jobId, operator, epoch, checkpoint, p, transcript, salt);
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
        _checkAsk(jobId, operator, spec.pricePerOperatorEpoch);
        if (spec.teeRequired) _requireAttestation(jobId, operator);
        uint256 count = _members[jobId].length + _pending[jobId].length;
        // With draws, an `Open` job's seats and a running job's vacancies go by stake: the
        // list takes applicants up to the cap, and the draw picks among them.
        bool drawing = _params.seatDrawWindow > 0;
        if (!drawing) {
            require(count < spec.maxOperators, JobFull(jobId, count, spec.maxOperators));
        } else {
            _applicationsOpen(jobId);
            if (count == _MAX_OPERATORS_CAP) {
                IDistributedTrainingBSMSeats(address(this)).displaceLightest(jobId, operator);
            }
        }

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
            if (_members[jobId].length < spec.minOperators) return;
            if (!drawing) {
                _openAttempt(jobId, j);
            } else if (_seatDrawAt[jobId] == 0) {
                uint64 drawAt = uint64(block.timestamp) + _params.seatDrawWindow;
                _seatDrawAt[jobId] = drawAt;
                emit SeatDrawScheduled(jobId, j.epoch, drawAt);
            }
        }
    }

    /// Applicants come and go until the draw is due (an `Open` job) or sealed (a running
    /// job's queue, at the epoch's first reveal): after it, the set is what the draw's seed
    /// (a block not mined yet) picks from, and nobody may change it.
    function _applicationsOpen(uint256 jobId) internal view {
        uint256 at = _seatDrawAt[jobId];
        require((at == 0 || block.timestamp < at) && _seatSeedBlock[jobId] == 0, SeatApplicationsClosed(jobId, at));
    }

    function _checkAsk(uint256 jobId, address operator, uint256 price) internal view {
        address token = _jobToken[jobId];
        (bool takes, uint256 ask) = _askIn(operator, token);
        require(takes, NoAskInToken(operator, token));
        if (token == address(0)) require(price >= ask, PriceBelowAsk(price, ask));
        else require(price >= ask, PriceBelowTokenAsk(token, price, ask));
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
        if (m != Membership.Pending && j.status == JobStatus.Running) {
            _membership[jobId][operator] = Membership.Leaving;
            if (block.timestamp <= j.epochStart + _specs[jobId].epochDuration) _leftInTime[j.attempt][operator] = true;
            emit LeaveRequested(jobId, operator, j.epoch + 1);
        } else {
            // An applicant (of an `Open` job, or queued for a running one's vacancies).
            _applicationsOpen(jobId);
            _removeFrom(m == Membership.Pending ? _pending[jobId] : _members[jobId], operator);
            _release(jobId, operator);
            // Too few applicants left to draw from: the next `minOperators`-th one reschedules.
            if (_members[jobId].length < _specs[jobId].minOperators) delete _seatDrawAt[jobId];
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
        bytes32 transcript,
        bytes32 salt
    ) internal {
        JobState storage j = _running(jobId, epoch);
        uint64 attempt = j.attempt;
        bytes32 commitment = _commitments[attempt][operator];
        require(commitment != bytes32(0), NotCommitted(jobId, epoch, operator));
        require(_votesOf[attempt][operator] == bytes32(0), AlreadyRevealed(jobId, epoch, operator));
        require(
            _commitmentHash(jobId, epoch, operator, checkpoint, participation, transcript, salt) == commitment,
            CommitmentMismatch(jobId, operator)
        );
        Tally storage t = _tallies[attempt];
        // The first reveal seals the queue for the epoch's vacancies: weights as of this
        // block, the next block's hash the seed.
        if (_params.seatDrawWindow > 0 && _seatSeedBlock[jobId] == 0) _seatSeedBlock[jobId] = uint64(block.number + 1);
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
        t.revealedAt = uint64(block.timestamp);
        if (votes > t.leaderVotes) {
            t.leaderVotes = votes;
            if (t.leaderKey != key) t.leaderKey = key;
        }
        emit CheckpointRevealed(jobId, epoch, operator, checkpoint, key, transcript);
    }

    function _running(uint256 jobId, uint256 epoch) internal view returns (JobState storage j) {
        j = _job(jobId);
        require(j.status == JobStatus.Running, JobNotRunning(jobId, j.status));
        require(epoch == j.epoch, WrongEpoch(jobId, epoch, j.epoch));
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
        uint256 findings; // the referees': bit i member i consistent, bit 128 + i caught by replay
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
        Challenge memory ch = _challenges[c.attempt];
        if (ch.challenger == address(0)) {
            uint256 until = _challengeCloses(t, members.length, closes);
            require(block.timestamp >= until, ChallengeWindowOpen(jobId, until));
        } else {
            require(ch.resolved, ChallengeUnresolved(jobId, epoch));
            // The referees re-executed the epoch: their verdict is the epoch's quorum vote.
            if (ch.verdict != bytes32(0)) (c.quorum, c.leaderKey, c.findings) = (true, ch.verdict, ch.findings);
        }
        c.unworkable = c.quorum && c.leaderKey == _UNWORKABLE;
        c.price =
            c.unworkable ? spec.pricePerOperatorEpoch * _params.unworkableCompBps / _BPS : spec.pricePerOperatorEpoch;
        c.stakersLate = block.timestamp > j.epochStart - _params.startGrace + _rewardPeriod();
        c.token = _jobToken[jobId];
        Vote memory v = c.quorum ? _voteData[c.attempt][c.leaderKey] : Vote(bytes32(0), 0);
        c.syncFailures = v.syncFailures;
        c.equivocators = _equivocators[c.attempt];
        Progress memory g = _progress[jobId];
        uint256 to = Math.min(members.length, g.cursor + maxMembers);
        bool inPieces = maxMembers == _HOOK_SETTLE_BATCH;
        bool closing = c.unworkable || _cancelRequested[jobId]
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
        if (_cancelRequested[jobId]) {
            uint256 refund = _close(jobId, JobStatus.Cancelled);
            emit JobCancelled(jobId, refund);
            return;
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
        } else if (c.findings & (1 << (_CAUGHT_SHIFT + i)) != 0) {
            // A packet its committed state does not give: work it did not do, whatever it voted.
            c.slashed += _slashMember(c, op, _params.fabricationSlashBps, SlashReason.FailedReplay);
        } else if (c.unworkable) {
            if (key == _UNWORKABLE) {
                _creditIn(c.token, op, c.price);
                c.paid += 1;
            }
        } else if (key == bytes32(0) && _commitments[c.attempt][op] != bytes32(0)) {
            // Committed, then kept its vote back once it could see the others': a losing vote
            // withheld must cost what a losing vote revealed costs.
            c.slashed += _slashMember(c, op, _params.fabricationSlashBps, SlashReason.WithheldReveal);
        } else if (
            key == bytes32(0) && c.quorum
                && (c.syncFailures & (1 << (_MISSED_SHIFT + i)) == 0 || _leftInTime[c.attempt][op])
        ) {
            // Late, not absent: the quorum counted its packets in every round, so it was there
            // to the end and only its vote missed the deadline; or it said on chain, by the
            // deadline, that it could not finish. Unpaid, but nothing proves it dropped out,
            // so it keeps its stake (a leave that denies the quorum is still a dropout).
            return;
        } else if (key == bytes32(0) || (c.quorum && key == _UNWORKABLE)) {
            // Silent, or could not work while a quorum could: did no work, fabricated nothing.
            c.slashed += _slashMember(c, op, _params.dropoutSlashBps, SlashReason.Dropout);
        } else if (!c.quorum) {
            return;
        } else if (key != c.leaderKey && c.findings & (1 << i) == 0) {
            c.slashed += _slashMember(c, op, _params.fabricationSlashBps, SlashReason.Fabrication);
        } else if (key == c.leaderKey && c.syncFailures & (1 << i) != 0) {
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
        address[] memory next = new address[](current.length);
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
        _writeMembers(current, next, n);
        // The queue takes the free seats (the hooks extension seats it, drawing them by stake
        // when more are queued); through the hooks a few a call, under the core's gas cap.
        if (_pending[jobId].length > 0) n += IDistributedTrainingBSMSeats(address(this)).drawVacancies(jobId, checked);
        delete _seatSeedBlock[jobId];
        // Every epoch needs minOperators (>= 2) members: nobody certifies its own checkpoint.
        if (n >= _specs[jobId].minOperators) {
            _openAttempt(jobId, j);
        } else {
            j.status = JobStatus.Open;
            j.epochStart = uint64(block.timestamp); // waiting since: `openTimeout` runs from here
            // A fresh attempt voids every JOIN signed before the job reopened (a signed call
            // names the attempt it is for): a join that failed earlier cannot be replayed now.
            j.attempt = _nextAttempt++;
        }
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
}
