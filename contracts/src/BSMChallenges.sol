// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IDistributedTrainingBSMChallenges} from "./interfaces/IDistributedTrainingBSM.sol";
import {BSMStorage} from "./BSMStorage.sol";

/// @title BSMChallenges
/// @notice The challenge game of IDistributedTrainingBSMChallenges, part of the views extension:
/// it runs on the BSM's storage and leaves its verdict in `_challenges`, which the BSM's
/// `_finalize` settles the epoch on.
abstract contract BSMChallenges is BSMStorage, IDistributedTrainingBSMChallenges {
    /// @inheritdoc IDistributedTrainingBSMChallenges
    function challenge(uint256 jobId, uint256 epoch, bytes32 transcript) external payable {
        JobState storage j = _current(jobId, epoch);
        uint64 attempt = j.attempt;
        // A vote without a quorum can be taken to the referees too: a minority that blocks the
        // quorum gets its own files judged, not a free veto.
        (uint256 until, bytes32 certified) = _certified(jobId, attempt, j);
        require(until != 0, NothingToChallenge(jobId, epoch));
        require(block.timestamp < until, ChallengeWindowClosed(until, block.timestamp));
        require(_operators[msg.sender].registered || msg.sender == j.caller, NotAChallenger(msg.sender));
        uint256 bond = _params.challengeBond;
        require(msg.value == bond, WrongChallengeBond(bond, msg.value));
        Challenge storage ch = _challenges[attempt];
        require(ch.challenger == address(0), AlreadyChallenged(jobId, epoch, ch.challenger));
        (ch.challenger, ch.openedAt, ch.transcript) = (msg.sender, uint64(block.timestamp), transcript);
        // The draw's inputs are fixed now; its seed is the next block's hash, unknown now.
        ch.seedBlock = uint64(block.number + 1);
        ch.weightsAt = uint48(block.number);
        ch.registrySize = _refereePools[jobId].registrySize;
        ch.maxWeight = uint96(_maxDrawWeight);
        ch.uncertified = certified == bytes32(0);
        // Held with the escrow until the challenge resolves (`accounting()` stays balanced).
        _totalEscrow += bond;
        emit Challenged(jobId, epoch, msg.sender, certified, transcript);
    }

    /// @inheritdoc IDistributedTrainingBSMChallenges
    function drawReferees(uint256 jobId, uint256 epoch) external {
        (Challenge storage ch, uint64 attempt) = _open(jobId, epoch);
        require(ch.seedBlock != 0, RefereesDrawnAlready(jobId, epoch));
        _draw(jobId, epoch, attempt, ch);
    }

    /// @inheritdoc IDistributedTrainingBSMChallenges
    function postTranscript(uint256 jobId, uint256 epoch, bytes32 transcript) external {
        (Challenge storage ch, uint64 attempt) = _open(jobId, epoch);
        _inPhase(ch.openedAt, 0);
        require(_commitments[attempt][msg.sender] != bytes32(0), NotMember(jobId, msg.sender));
        emit TranscriptPosted(jobId, epoch, msg.sender, transcript);
    }

    /// @inheritdoc IDistributedTrainingBSMChallenges
    function commitVerdict(uint256 jobId, uint256 epoch, bytes32 commitment) external {
        (Challenge storage ch, uint64 attempt) = _open(jobId, epoch);
        _inPhase(ch.openedAt, 1);
        if (ch.seedBlock != 0) _draw(jobId, epoch, attempt, ch);
        require(_refereeSteps[attempt][msg.sender] == RefereeStep.Drawn, NotAReferee(jobId, msg.sender));
        require(commitment != bytes32(0), ZeroValue());
        _verdictCommitments[attempt][msg.sender] = commitment;
        _refereeSteps[attempt][msg.sender] = RefereeStep.Committed;
        ch.committed += 1;
        emit VerdictCommitted(jobId, epoch, msg.sender);
    }

    /// @inheritdoc IDistributedTrainingBSMChallenges
    function revealVerdict(
        uint256 jobId,
        uint256 epoch,
        bytes32 checkpoint,
        uint32[] calldata participation,
        uint256 findings,
        bytes32 salt
    ) external {
        (Challenge storage ch, uint64 attempt) = _open(jobId, epoch);
        // Opens early once every drawn referee committed: nobody is left to copy a verdict.
        uint256 closes = ch.openedAt + 3 * uint256(_params.challengeWindow);
        uint256 opens = ch.drawn > 0 && ch.committed == ch.drawn ? 0 : closes - _params.challengeWindow;
        require(block.timestamp >= opens && block.timestamp < closes, NotInPhase(opens, closes, block.timestamp));
        require(_refereeSteps[attempt][msg.sender] == RefereeStep.Committed, NotAReferee(jobId, msg.sender));
        require(
            _commitmentHash(jobId, epoch, msg.sender, checkpoint, participation, bytes32(findings), salt)
                == _verdictCommitments[attempt][msg.sender],
            CommitmentMismatch(jobId, msg.sender)
        );
        require(checkpoint != bytes32(0), ZeroCheckpoint());
        uint256 n = _members[jobId].length;
        uint256 inRange = (1 << n) - 1;
        require(findings & ~(inRange | inRange << _CAUGHT_SHIFT) == 0, FindingsOutOfRange(findings, n));
        bytes32 key = checkpoint == _UNWORKABLE ? _UNWORKABLE : _storeVote(jobId, attempt, checkpoint, participation);
        // The referees must agree on the vote and on their findings about the members.
        bytes32 verdict = keccak256(abi.encode(key, findings));
        _verdictOf[attempt][msg.sender] = verdict;
        _refereeSteps[attempt][msg.sender] = RefereeStep.Revealed;
        ch.revealed += 1;
        uint256 votes = ++_verdictCounts[attempt][verdict];
        if (votes * 2 > ch.drawn && ch.drawn >= _minJury()) (ch.verdict, ch.findings) = (key, findings);
        emit VerdictRevealed(jobId, epoch, msg.sender, checkpoint, key, findings);
    }

    /// @inheritdoc IDistributedTrainingBSMChallenges
    function resolveChallenge(uint256 jobId, uint256 epoch) external {
        (Challenge storage ch, uint64 attempt) = _open(jobId, epoch);
        if (ch.drawn == 0 || ch.revealed < ch.drawn) {
            uint256 ends = ch.openedAt + 3 * uint256(_params.challengeWindow);
            require(block.timestamp >= ends, NotInPhase(ends, type(uint64).max, block.timestamp));
        }
        ch.resolved = true;
        bytes32 verdict = ch.verdict;
        (uint256 slashed, uint256 fee) = _settleReferees(jobId, epoch, attempt, verdict);
        bool overturned = verdict != bytes32(0) && verdict != _tallies[attempt].leaderKey;
        uint256 bond = _params.challengeBond;
        _totalEscrow -= bond;
        // A challenge the referees upheld cost its challenger the bond, unless it proved a
        // member's packet false by replay, or the challenger is a voter of another vote whose
        // own transcript leads to that vote (it had to dispute to be judged on it); one they
        // could not judge (no majority, too small a jury) changed nothing but delayed every
        // member's pay, and costs it a quarter of the bond. A verdict's referees are paid from
        // the bond whatever they decided: their pay cannot bias them.
        address treasury = _params.treasury;
        bool excused = verdict == bytes32(0) || overturned || ch.uncertified || ch.findings >> _CAUGHT_SHIFT != 0
            || (_votesOf[attempt][ch.challenger] != verdict && _isConsistent(jobId, ch.challenger, ch.findings));
        if (verdict == bytes32(0)) (fee, slashed) = (bond / 4, slashed + bond / 4); // to the treasury
        _credit(excused ? ch.challenger : treasury, bond - fee);
        if (slashed > 0) _credit(treasury, slashed);
        emit ChallengeResolved(jobId, epoch, verdict, overturned);
    }

    /// @inheritdoc IDistributedTrainingBSMChallenges
    function challengeOf(uint64 attempt) external view returns (ChallengeInfo memory info) {
        Challenge memory ch = _challenges[attempt];
        info = ChallengeInfo({
            challenger: ch.challenger,
            openedAt: ch.openedAt,
            resolved: ch.resolved,
            transcript: ch.transcript,
            certifiedKey: ch.challenger == address(0) || ch.uncertified ? bytes32(0) : _tallies[attempt].leaderKey,
            verdictKey: ch.verdict,
            consistent: ch.findings & type(uint128).max,
            caught: ch.findings >> _CAUGHT_SHIFT,
            committed: ch.committed,
            revealed: ch.revealed,
            seedBlock: ch.seedBlock,
            referees: _referees[attempt]
        });
    }

    /// @inheritdoc IDistributedTrainingBSMChallenges
    function certifiedVote(uint256 jobId) external view returns (bytes32 voteKey, uint256 challengeCloses) {
        JobState storage j = _jobs[jobId];
        if (j.status != JobStatus.Running) return (bytes32(0), 0);
        (challengeCloses, voteKey) = _certified(jobId, j.attempt, j);
    }

    // ---------------------------------------------------------------- internal

    function _isConsistent(uint256 jobId, address who, uint256 findings) private view returns (bool) {
        address[] storage members = _members[jobId];
        for (uint256 i; i < members.length; ++i) {
            if (members[i] == who) return findings & (1 << i) != 0;
        }
        return false;
    }

    function _current(uint256 jobId, uint256 epoch) private view returns (JobState storage j) {
        j = _jobs[jobId];
        require(j.status == JobStatus.Running, JobNotRunning(jobId, j.status));
        require(epoch == j.epoch, WrongEpoch(jobId, epoch, j.epoch));
    }

    /// The challenge window's end and the certified vote key of `attempt` (zero: no quorum, or
    /// the reveals are still open).
    function _certified(uint256 jobId, uint64 attempt, JobState storage j)
        private
        view
        returns (uint256 until, bytes32 key)
    {
        Tally memory t = _tallies[attempt];
        uint256 n = _members[jobId].length;
        uint256 closes = j.epochStart + _specs[jobId].epochDuration + _params.revealWindow;
        if (t.revealed < n && block.timestamp <= closes) return (0, bytes32(0));
        until = _challengeCloses(t, n, closes);
        if (t.leaderVotes > 0 && uint256(t.leaderVotes) * 3 >= n * 2) key = t.leaderKey;
    }

    function _open(uint256 jobId, uint256 epoch) private view returns (Challenge storage ch, uint64 attempt) {
        attempt = _current(jobId, epoch).attempt;
        ch = _challenges[attempt];
        require(ch.challenger != address(0), NotChallenged(jobId, epoch));
        require(!ch.resolved, ChallengeResolvedAlready(jobId, epoch));
    }

    /// Phase `k` of a challenge opened at `openedAt`: apply (0) or commit (1); each lasts
    /// `challengeWindow`, and the reveal after them too.
    function _inPhase(uint256 openedAt, uint256 k) private view {
        uint256 w = _params.challengeWindow;
        uint256 opens = openedAt + k * w;
        uint256 closes = openedAt + (k + 1) * w;
        require(block.timestamp >= opens && block.timestamp < closes, NotInPhase(opens, closes, block.timestamp));
    }

    /// Draws up to `refereeCount` referees among the registered outsiders (see
    /// `drawReferees`): each try picks a registry entry from the seed and accepts it with
    /// probability (its weight when the challenge opened) / (the largest weight then); a try
    /// that picks an insider, a referee already drawn or nobody is spent. A seed block out of
    /// reach (older than 256 blocks) is replaced by the current one, whose hash nobody knows.
    function _draw(uint256 jobId, uint256 epoch, uint64 attempt, Challenge storage ch) private {
        uint256 seedBlock = ch.seedBlock;
        require(block.number > seedBlock, SeedNotMined(seedBlock, block.number));
        uint256 seed = uint256(blockhash(seedBlock));
        if (seed == 0) {
            ch.seedBlock = uint64(block.number);
            emit RefereeSeedRenewed(jobId, epoch, block.number);
            return;
        }
        ch.seedBlock = 0;
        uint256 want = _params.refereeCount;
        uint256 size = ch.registrySize;
        uint256 maxWeight = ch.maxWeight;
        uint256 at = ch.weightsAt;
        uint256 created = _refereePools[jobId].createdAt;
        address caller = _jobs[jobId].caller;
        address[] storage drawn = _referees[attempt];
        for (uint256 k; k < want * _REFEREE_DRAW_TRIES && drawn.length < want && maxWeight * size > 0; ++k) {
            uint256 r = uint256(keccak256(abi.encode(seed, attempt, k)));
            address a = _registry[(r >> 128) % size];
            if (
                _membership[jobId][a] != Membership.None || a == caller || a == ch.challenger
                    || _refereeSteps[attempt][a] != RefereeStep.None
            ) continue;
            uint256 w = _drawWeightAt(a, at);
            uint256 then = _drawWeightAt(a, created);
            if (uint128(r) % maxWeight >= (then < w ? then : w)) continue;
            drawn.push(a);
            _refereeSteps[attempt][a] = RefereeStep.Drawn;
        }
        ch.drawn = uint8(drawn.length);
        emit RefereesDrawn(jobId, epoch, drawn);
    }

    /// Slashes the drawn referees that committed and never revealed (fabrication rate) and,
    /// with a verdict, those that revealed another (fabrication rate) or never committed
    /// (dropout rate); credits the verdict's referees half the bond, shared (`fee`: what
    /// they got). Without a verdict a referee that never committed is not slashed: the
    /// files it needed may never have been served.
    function _settleReferees(uint256 jobId, uint256 epoch, uint64 attempt, bytes32 verdict)
        private
        returns (uint256 slashed, uint256 fee)
    {
        address[] memory refs = _referees[attempt];
        bytes32 agreed = keccak256(abi.encode(verdict, _challenges[attempt].findings));
        uint256 share = verdict == bytes32(0) ? 0 : _params.challengeBond / 2 / _verdictCounts[attempt][agreed];
        for (uint256 i; i < refs.length; ++i) {
            address r = refs[i];
            RefereeStep step = _refereeSteps[attempt][r];
            if (
                step == RefereeStep.Committed
                    || (verdict != bytes32(0) && step == RefereeStep.Revealed && _verdictOf[attempt][r] != agreed)
            ) {
                slashed += _slash(r, _params.fabricationSlashBps, jobId, epoch, SlashReason.WrongVerdict, msg.sender);
            } else if (verdict != bytes32(0) && step == RefereeStep.Drawn) {
                slashed += _slash(r, _params.dropoutSlashBps, jobId, epoch, SlashReason.Dropout, msg.sender);
            } else if (share > 0 && step == RefereeStep.Revealed) {
                _credit(r, share);
                fee += share;
            }
        }
    }
}
