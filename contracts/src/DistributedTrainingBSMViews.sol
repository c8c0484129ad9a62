// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IDistributedTrainingBSMViews} from "./interfaces/IDistributedTrainingBSM.sol";
import {IAttestationVerifier} from "./interfaces/IAttestationVerifier.sol";
import {BSMStorage} from "./BSMStorage.sol";
import {BSMTokenPayments} from "./BSMTokenPayments.sol";
import {BSMChallenges} from "./BSMChallenges.sol";
import {GossipEnvelope} from "./libraries/GossipEnvelope.sol";

/// @title DistributedTrainingBSMViews
/// @notice The read-only half of the BSM. Deployed before `DistributedTrainingBSM`, which takes
/// its address and delegates every call it does not implement to it, so these functions run
/// on the BSM's storage; called directly, it reads its own empty state. What it does not
/// implement either (the Tangle hooks) it delegates on to the hooks extension. It also holds
/// the entry points of jobs paid in ERC-20 tokens (BSMTokenPayments) and the challenge game
/// (BSMChallenges); the seat draw (BSMSeats) is in the hooks extension.
contract DistributedTrainingBSMViews is BSMStorage, BSMTokenPayments, BSMChallenges, IDistributedTrainingBSMViews {
    address private immutable _HOOKS;

    constructor(address hooks) {
        require(hooks.code.length > 0, ExtensionHasNoCode(hooks));
        _HOOKS = hooks;
    }

    /// Payable: the staking entry points it reaches in the hooks extension take ether.
    fallback() external payable {
        address hooks = _HOOKS;
        assembly ("memory-safe") {
            calldatacopy(0, 0, calldatasize())
            let ok := delegatecall(gas(), hooks, 0, calldatasize(), 0, 0)
            returndatacopy(0, 0, returndatasize())
            if iszero(ok) { revert(0, returndatasize()) }
            return(0, returndatasize())
        }
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function declineJob(uint256 jobId, bytes32 reason, string calldata detail) external {
        require(_jobs[jobId].status != JobStatus.None, UnknownJob(jobId));
        require(_operators[msg.sender].registered, NotRegistered(msg.sender));
        uint256 max = 256;
        require(bytes(detail).length <= max, DetailTooLong(bytes(detail).length, max));
        emit JobDeclined(jobId, msg.sender, reason, detail);
    }

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
            hardware: o.hardware
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
    function cancelRequested(uint256 jobId) external view returns (bool) {
        return _cancelRequested[jobId];
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
    function submissionOf(uint256 jobId, address operator)
        external
        view
        returns (bytes32 commitment, bytes32 checkpoint, bytes32 voteKey)
    {
        JobState storage j = _jobs[jobId];
        if (j.status != JobStatus.Running) return (bytes32(0), bytes32(0), bytes32(0));
        commitment = _commitments[j.attempt][operator];
        voteKey = _votesOf[j.attempt][operator];
        if (voteKey == _UNWORKABLE) checkpoint = _UNWORKABLE;
        else if (voteKey != bytes32(0)) checkpoint = _voteData[j.attempt][voteKey].checkpoint;
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function voteCounts(uint256 jobId) external view returns (uint256 committed, uint256 revealed) {
        JobState storage j = _jobs[jobId];
        if (j.status != JobStatus.Running) return (0, 0);
        Tally storage t = _tallies[j.attempt];
        return (t.committed, t.revealed);
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function epochDeadline(uint256 jobId) public view returns (uint64) {
        JobState storage j = _jobs[jobId];
        if (j.status != JobStatus.Running) return 0;
        return j.epochStart + _specs[jobId].epochDuration;
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function revealDeadline(uint256 jobId) external view returns (uint64) {
        uint64 deadline = epochDeadline(jobId);
        return deadline == 0 ? 0 : deadline + _params.revealWindow;
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function commitmentHash(
        uint256 jobId,
        uint256 epoch,
        address operator,
        bytes32 checkpoint,
        uint32[] calldata participation,
        bytes32 evidence,
        bytes32 salt
    ) external pure returns (bytes32) {
        return _commitmentHash(jobId, epoch, operator, checkpoint, participation, evidence, salt);
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function UNWORKABLE() external pure returns (bytes32) {
        return _UNWORKABLE;
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function bondedOf(address operator) external view returns (uint256) {
        return _bonded[operator];
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

    /// @inheritdoc IDistributedTrainingBSMViews
    function cancelSignedCalls() external {
        emit SignedCallsCancelled(msg.sender, _nonces[msg.sender]++);
    }

    // ---------------------------------------------------------------- equivocation

    /// @inheritdoc IDistributedTrainingBSMViews
    function reportEquivocation(uint256 jobId, bytes calldata first, bytes calldata second) external {
        JobState storage j = _jobs[jobId];
        require(j.status == JobStatus.Running, JobNotRunning(jobId, j.status));
        GossipEnvelope.Header memory a = GossipEnvelope.read(first);
        GossipEnvelope.Header memory b = GossipEnvelope.read(second);
        _checkEnvelope(a, jobId, j.attempt);
        _checkEnvelope(b, jobId, j.attempt);
        require(
            a.sender == b.sender && a.round == b.round && a.payloadSha256 != b.payloadSha256,
            NotAnEquivocation(a.sender, b.sender, a.round, b.round)
        );
        address[] storage members = _members[jobId];
        uint256 n = members.length;
        uint256 i;
        while (i < n && members[i] != a.sender) ++i;
        require(i < n, NotMember(jobId, a.sender));
        uint256 mask = _equivocators[j.attempt];
        require(mask & (1 << i) == 0, EquivocationKnown(jobId, a.sender));
        _equivocators[j.attempt] = mask | (1 << i);
        emit EquivocationProven(jobId, j.epoch, a.sender, a.round, msg.sender);
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function equivocators(uint256 jobId) external view returns (uint256) {
        return _equivocators[_jobs[jobId].attempt];
    }

    function _checkEnvelope(GossipEnvelope.Header memory h, uint256 jobId, uint64 attempt) private view {
        require(
            h.chainId == block.chainid && h.contractAddress == address(this) && h.jobId == jobId,
            ProofForAnotherJob(h.chainId, h.contractAddress, h.jobId)
        );
        require(h.epoch == attempt, ProofNotCurrentAttempt(jobId, h.epoch, attempt));
        require(h.signer == h.sender, EnvelopeNotSignedBySender(h.sender, h.signer));
    }

    // ---------------------------------------------------------------- TEE attestation

    /// @inheritdoc IDistributedTrainingBSMViews
    function submitAttestation(address verifier, bytes calldata evidence) external {
        Operator storage o = _operators[msg.sender];
        require(o.registered, NotRegistered(msg.sender));
        require(_attestationVerifiers[verifier], VerifierNotAllowed(verifier));
        bytes32 peerKey = o.peerKey;
        // A view call (STATICCALL): the verifier cannot change state or re-enter.
        (uint64 issuedAt, uint64 expiresAt, uint8 teeType, bytes32 measurement) =
            IAttestationVerifier(verifier).verify(msg.sender, peerKey, evidence);
        require(expiresAt > block.timestamp, AttestationExpired(expiresAt, block.timestamp));
        _attestations[msg.sender] = Attestation(verifier, expiresAt, teeType, issuedAt, measurement, peerKey);
        emit AttestationSubmitted(msg.sender, verifier, teeType, measurement, peerKey, expiresAt);
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function setAttestationVerifier(address verifier, bool allowed) external {
        address developer = _params.developer;
        require(msg.sender == developer, NotDeveloper(msg.sender, developer));
        if (_attestationVerifiers[verifier] == allowed) return;
        if (allowed) {
            require(verifier.code.length > 0, VerifierHasNoCode(verifier));
            uint256 count = _attestationVerifierCount;
            require(count < _MAX_ATTESTATION_VERIFIERS, TooManyVerifiers(count, _MAX_ATTESTATION_VERIFIERS));
            _attestationVerifierCount = count + 1;
        } else {
            _attestationVerifierCount -= 1;
        }
        _attestationVerifiers[verifier] = allowed;
        emit AttestationVerifierSet(verifier, allowed);
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function isAttestationVerifier(address verifier) external view returns (bool) {
        return _attestationVerifiers[verifier];
    }

    /// @inheritdoc IDistributedTrainingBSMViews
    function attestationOf(address operator)
        external
        view
        returns (
            address verifier,
            uint64 issuedAt,
            uint64 expiresAt,
            uint8 teeType,
            bytes32 measurement,
            bytes32 peerKey,
            bool valid
        )
    {
        Attestation storage a = _attestations[operator];
        (verifier, issuedAt, expiresAt, teeType, measurement, peerKey) =
        (a.verifier, a.issuedAt, a.expiresAt, a.teeType, a.measurement, a.peerKey);
        // Only an allowed verifier is asked whether its trust root changed since.
        valid = _attestationVerifiers[verifier] && block.timestamp < expiresAt
            && peerKey == _operators[operator].peerKey && issuedAt >= IAttestationVerifier(verifier).validSince();
    }
}
