// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @title IDistributedTrainingBSMTypes
/// @notice Types, errors and events of the BSM.
interface IDistributedTrainingBSMTypes {
    // ---------------------------------------------------------------- types

    /// @notice Training objective of a job.
    enum Method {
        CPT,
        SFT,
        DPO,
        GRPO
    }

    /// @notice Lifecycle of a job. `Open`: waiting for `max(2, minOperators)` members before an
    /// epoch can start (the first, or any later one after a boundary left fewer). `Running`: an
    /// epoch is in progress. `Cancelled`: by its caller, at once while `Open`, at the next epoch
    /// boundary while `Running` (`cancelJob`). `Failed`: no quorum `maxFailedEpochs` times in a row, voted
    /// unworkable, or left `Open` for `openTimeout` after it started.
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
        External,
        Equivocation,
        WithheldReveal,
        /// A referee revealed a verdict other than the referees' majority, or never revealed
        /// the verdict it committed.
        WrongVerdict,
        /// A challenge's referees replayed a round of the member from its committed private
        /// state and got another packet than the one it sent (a free-rider, or made-up work).
        FailedReplay
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
        /// Share of the protocol's cut of an epoch's payments credited to its finalizer, capped
        /// at `maxReporterBounty` (in the job's currency); nothing when the finalizer is the
        /// job's caller or in the job. It never depends on a slash: slashed stake goes to the
        /// treasury, all of it, so nobody profits from slashing anyone.
        uint16 reporterBountyBps;
        /// Minimum share of an epoch's sync rounds a member must have contributed to.
        uint16 syncThresholdBps;
        /// Paid from the escrow, in bps of the job's price, to each member that voted an epoch
        /// `UNWORKABLE` when that vote reached quorum (the job is then aborted, nobody slashed).
        /// Below `operatorBps`, so training an epoch always pays a member more.
        uint16 unworkableCompBps;
        /// Hard cap on members per job; every loop in the contract is bounded by it.
        uint8 maxOperators;
        /// Consecutive epochs without quorum after which a job fails.
        uint8 maxFailedEpochs;
        /// Referees drawn (by capped self-stake, among every registered operator outside the
        /// job, its caller and the challenger) to re-execute a challenged epoch; odd, so a
        /// majority always exists among them. A jury of fewer than `refereeCount / 2 + 1`
        /// decides nothing.
        uint8 refereeCount;
        /// Must be at least 4 x (startGrace + minEpochDuration + revealWindow): an epoch with its
        /// reveal window spans at most a quarter of it (`maxEpochDuration`), so stake queued
        /// while it backs an epoch stays slashable for three quarters of the period after the
        /// epoch's reveal deadline.
        uint64 unbondingPeriod;
        /// Shortest epoch a job may ask for, in seconds.
        uint64 minEpochDuration;
        /// Seconds between an epoch's start condition (enough joins, or the previous epoch
        /// finalized) and the start of its `epochDuration`.
        uint64 startGrace;
        /// Seconds after an epoch's commit deadline in which members reveal their votes.
        uint64 revealWindow;
        /// Seconds a job that has started may wait `Open` for members before anyone may fail it
        /// (full refund of the remaining escrow) with `cancelJob`.
        uint64 openTimeout;
        /// Seconds after an epoch's last reveal (or its reveal deadline) in which its certified
        /// vote may be challenged; each phase of a challenge (referees apply, commit, reveal)
        /// lasts as long. 0: no challenges, a certified vote is final at once.
        uint64 challengeWindow;
        /// Seconds a job's seats stay open to applications once `minOperators` have applied,
        /// before `drawSeats` draws `maxOperators` of them by stake (see
        /// IDistributedTrainingBSMSeats). 0: seats go to the first joiners and the epoch starts
        /// at the `minOperators`-th join.
        uint64 seatDrawWindow;
        /// Cap on a finalizer's reward for settling one epoch (see `reporterBountyBps`).
        uint96 maxReporterBounty;
        uint256 minStake;
        /// Least `seatBond` a job may ask for, in wei.
        uint256 minSeatBond;
        /// Ether a challenger bonds (returned when the referees overturn the certified vote or
        /// reach no verdict, sent to the treasury when they uphold it), and self-stake each
        /// referee bonds while the challenge is open.
        uint256 challengeBond;
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
        uint8 minOperators; // at least 2: an epoch starts only with max(2, minOperators) members
        uint8 maxOperators;
        uint64 epochDuration; // seconds from epoch start to its commit deadline
        bool teeRequired;
        uint256 pricePerOperatorEpoch;
        /// Self-stake each member bonds for its seat while in the job (>= `minSeatBond`); bonded
        /// stake backs no other seat and cannot be unstaked until the member leaves.
        uint256 seatBond;
        /// sha256 of the job's training recipe (its canonical JSON: every hyper-parameter each
        /// node must apply identically); zero means the reference node's default recipe. Not
        /// validated on-chain: nodes check it against the document at `recipeUri` before joining.
        bytes32 recipeHash;
        string recipeUri;
    }

    /// @notice Mutable state of a job.
    struct JobState {
        address caller;
        JobStatus status;
        uint32 epoch; // index of the epoch in progress (== number of finalized epochs)
        uint8 failedEpochs; // consecutive epochs without quorum
        uint64 attempt; // global attempt counter of the epoch in progress; keys votes
        uint64 epochStart; // Running: start of the epoch's duration; Open after a boundary: since when
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
    }

    /// A challenge of an epoch attempt's certified vote (see IDistributedTrainingBSMChallenges).
    struct ChallengeInfo {
        address challenger; // address(0): not challenged
        uint64 openedAt;
        bool resolved;
        bytes32 transcript; // sha256 of the transcript file the challenger serves
        bytes32 certifiedKey; // the vote key the challenge disputes
        bytes32 verdictKey; // the referees' majority vote key; zero: no verdict (yet)
        uint256 consistent; // with the verdict: bit i set, member i's own transcript leads to its vote
        uint256 caught; // with the verdict: bit i set, member i's replayed packet is not the one it sent
        uint256 committed;
        uint256 revealed;
        uint256 seedBlock; // the block whose hash draws the referees; 0 once drawn
        address[] referees; // empty until drawn
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
    // Each notice is the one-line message the SDK and CLI show for the error: a `name` in
    // backticks stands for that argument's decoded value (amounts in ETH, statuses by name).

    /// @notice fee basis points sum to `sum`, not 10000
    error BpsSumNot10000(uint256 sum);
    /// @notice slash of `bps` bps above the maximum `max`
    error SlashBpsTooHigh(uint256 bps, uint256 max);
    /// @notice `bps` basis points is more than 100%
    error BpsTooHigh(uint256 bps);
    /// @notice maxOperators `maxOperators` outside 1..`cap`
    error InvalidMaxOperators(uint256 maxOperators, uint256 cap);
    /// @notice treasury and developer must not be the zero address
    error ZeroAddress();
    /// @notice a zero amount was given where a positive one is required
    error ZeroValue();
    /// @notice a `declineJob` detail of `length` bytes; at most `max`
    error DetailTooLong(uint256 length, uint256 max);
    /// @notice only the Tangle core `core` may call this (caller `caller`)
    error NotCore(address caller, address core);
    /// @notice stake `stake` below minimum `minStake`
    /// @param stake self-stake the operator would have, in wei.
    error StakeBelowMinimum(uint256 stake, uint256 minStake);
    /// @notice operator `operator` is already registered
    error AlreadyRegistered(address operator);
    /// @notice `operator` is not a registered operator
    error NotRegistered(address operator);
    /// @notice cannot take `requested`: only `available` staked
    /// @param available active stake that may be unbonded, in wei.
    error InsufficientStake(uint256 requested, uint256 available);
    /// @notice operator `operator` is still in `activeJobs` job(s)
    error OperatorHasActiveJobs(address operator, uint256 activeJobs);
    /// @notice `account` has nothing unbonding with operator `operator`
    error NothingUnbonding(address operator, address account);
    /// @notice stake unlocks at `unlockAt` (now `nowTs`)
    /// @param unlockAt unix time (seconds) from which the unbonded stake may be withdrawn.
    /// @param nowTs timestamp of the block that reverted.
    error StillUnbonding(uint256 unlockAt, uint256 nowTs);
    /// @notice `account` has no credit to withdraw
    error NothingToWithdraw(address account);
    /// @notice sending `amount` to `to` failed
    error TransferFailed(address to, uint256 amount);
    /// @notice operators min `minOperators` / max `maxOperators`: need 2 <= min <= max <= `cap`
    error InvalidOperatorRange(uint256 minOperators, uint256 maxOperators, uint256 cap);
    /// @notice invalid schedule: `totalEpochs` epochs of `stepsPerEpoch` steps, sync every `syncInterval`
    error InvalidSchedule(uint256 totalEpochs, uint256 stepsPerEpoch, uint256 syncInterval);
    /// @notice invalid compression: top-k `topkPerChunk`, `quantBits`-bit values
    error InvalidCompression(uint256 topkPerChunk, uint256 quantBits);
    /// @notice epoch duration `duration`s outside `min`s..`max`s
    /// @param max maxEpochDuration(): a quarter of the unbonding period less the start grace and the reveal window.
    error InvalidEpochDuration(uint256 duration, uint256 min, uint256 max);
    /// @notice unbonding period `unbondingPeriod`s is shorter than `needed`s (4 x (startGrace + minEpochDuration + revealWindow + 4 x challengeWindow))
    error UnbondingTooShort(uint256 unbondingPeriod, uint256 needed);
    /// @notice escrow must be exactly `expected`, got `sent`
    /// @param expected price x maxOperators x totalEpochs, in wei.
    error WrongEscrow(uint256 expected, uint256 sent);
    /// @notice job `jobId` does not exist
    error UnknownJob(uint256 jobId);
    /// @notice `sender` is not the caller `caller` of this job
    error NotJobCaller(address sender, address caller);
    /// @notice job `jobId` is `status`, not open
    error JobNotOpen(uint256 jobId, JobStatus status);
    /// @notice job `jobId` is `status`, not running
    error JobNotRunning(uint256 jobId, JobStatus status);
    /// @notice job `jobId` already ended (`status`): there is nothing left to cancel
    error JobEnded(uint256 jobId, JobStatus status);
    /// @notice the caller already asked job `jobId` to end after epoch `epoch`
    error CancelAlreadyRequested(uint256 jobId, uint256 epoch);
    /// @notice epoch `epoch` of job `jobId` is being settled in pieces; cancel once it has ended
    error SettlementInProgress(uint256 jobId, uint256 epoch);
    /// @notice job `jobId` is full: `members` of `maxOperators` operators
    error JobFull(uint256 jobId, uint256 members, uint256 maxOperators);
    /// @notice `operator` already joined job `jobId`
    error AlreadyMember(uint256 jobId, address operator);
    /// @notice `operator` is not a member of job `jobId`
    error NotMember(uint256 jobId, address operator);
    /// @notice `operator` is already leaving job `jobId`
    error AlreadyLeaving(uint256 jobId, address operator);
    /// @notice job price `price` below the operator's ask `ask`
    error PriceBelowAsk(uint256 price, uint256 ask);
    /// @notice job price `price` below the operator's ask `ask`, in base units of token `token`
    error PriceBelowTokenAsk(address token, uint256 price, uint256 ask);
    /// @notice `operator` set no ask in token `token` and asks more than nothing in ether: it takes no job priced in that token until it sets one (updateAsk)
    error NoAskInToken(address operator, address token);
    /// @notice job `jobId` requires a TEE attestation of `operator` that counts: by a verifier still allowed, for its current peer key, unexpired (recorded one expires: `expiresAt`; now `nowTs`)
    /// @param expiresAt when the operator's recorded attestation expires (0: none).
    error AttestationRequired(uint256 jobId, address operator, uint256 expiresAt, uint256 nowTs);
    /// @notice job `jobId` is in epoch `current`, not `given`
    error WrongEpoch(uint256 jobId, uint256 given, uint256 current);
    /// @notice `length` bytes are not an encoded gossip envelope of version 2
    error MalformedEnvelope(uint256 length);
    /// @notice an equivocation proof's envelope is for chain `chainId`, contract `contractAddress`
    /// and job `jobId`: another chain, contract or job
    error ProofForAnotherJob(uint256 chainId, address contractAddress, uint256 jobId);
    /// @notice an equivocation proof for job `jobId` is of epoch attempt `given`, not its current
    /// attempt `current`
    error ProofNotCurrentAttempt(uint256 jobId, uint256 given, uint256 current);
    /// @notice a proof's envelope names `sender` as its sender but is signed by `signer`
    error EnvelopeNotSignedBySender(address sender, address signer);
    /// @notice the envelopes of `firstSender` (round `firstRound`) and `secondSender` (round
    /// `secondRound`) are not one sender's two different packets for one round
    error NotAnEquivocation(address firstSender, address secondSender, uint256 firstRound, uint256 secondRound);
    /// @notice the equivocation of `operator` in the current attempt of job `jobId` is already
    /// recorded
    error EquivocationKnown(uint256 jobId, address operator);
    /// @notice epoch deadline `deadline` has passed (now `nowTs`)
    /// @param deadline unix time (seconds) after which submissions are refused.
    /// @param nowTs timestamp of the block that reverted.
    error DeadlinePassed(uint256 deadline, uint256 nowTs);
    /// @notice `operator` already committed for job `jobId` epoch `epoch`
    error AlreadyCommitted(uint256 jobId, uint256 epoch, address operator);
    /// @notice `operator` already revealed for job `jobId` epoch `epoch`
    error AlreadyRevealed(uint256 jobId, uint256 epoch, address operator);
    /// @notice `operator` has no commitment to reveal for job `jobId` epoch `epoch`
    error NotCommitted(uint256 jobId, uint256 epoch, address operator);
    /// @notice the revealed vote of `operator` does not match its commitment in job `jobId`
    error CommitmentMismatch(uint256 jobId, address operator);
    /// @notice reveals open after `opensAfter` or once every member committed (now `nowTs`)
    /// @param opensAfter the epoch's commit deadline (unix seconds).
    error RevealNotOpen(uint256 opensAfter, uint256 nowTs);
    /// @notice the reveal window closed at `closedAt` (now `nowTs`)
    error RevealClosed(uint256 closedAt, uint256 nowTs);
    /// @notice checkpoint hash and commitment must not be zero
    error ZeroCheckpoint();
    /// @notice self-stake `selfStake` cannot bond this seat: `needed` needed (minimum stake and every seat bond)
    error InsufficientFreeStake(uint256 selfStake, uint256 needed);
    /// @notice `remaining` of self-stake would be left, below the `needed` bonded in jobs or the minimum stake
    error StakeBonded(uint256 remaining, uint256 needed);
    /// @notice seat bond `seatBond` below the minimum `minSeatBond`
    error SeatBondTooLow(uint256 seatBond, uint256 minSeatBond);
    /// @notice unworkable compensation `bps` bps must be below the operator share `operatorBps`
    error InvalidUnworkableComp(uint256 bps, uint256 operatorBps);
    /// @notice job `jobId` may be failed by anyone only after `timeoutAt` (now `nowTs`)
    /// @param timeoutAt unix seconds: when the job has waited `openTimeout` for members.
    error OpenTimeoutPending(uint256 jobId, uint256 timeoutAt, uint256 nowTs);
    /// @notice only the BSM's own hooks extension may call this (caller `caller`)
    error OnlySelf(address caller);
    /// @notice participation has `given` entries, the epoch has `expected` members
    error ParticipationLength(uint256 given, uint256 expected);
    /// @notice participation[`index`] = `rounds` exceeds `maxRounds` rounds
    /// @param maxRounds sync rounds in an epoch (stepsPerEpoch / syncInterval).
    error ParticipationTooHigh(uint256 index, uint256 rounds, uint256 maxRounds);
    /// @notice job `jobId`: `revealed` of `members` members revealed and the reveal deadline `deadline` has not passed
    error EpochNotFinalizable(uint256 jobId, uint256 revealed, uint256 members, uint256 deadline);
    /// @notice unknown job kind `job`
    /// @param job the `onJobCall` / `onJobResult` job id (JOIN=1, LEAVE=2, COMMIT=3, REVEAL=4, FINALIZE=5).
    error UnknownJobKind(uint8 job);
    /// @notice slash percent `percent` outside 1..50
    error InvalidSlashPercent(uint256 percent);
    /// @notice the hook call is not signed by operator `operator` with its nonce `nonce`
    /// @param nonce the operator's next nonce (`operatorNonce`), which the signature must cover.
    error InvalidOperatorSignature(address operator, uint256 nonce);
    /// @notice the signed call of `operator` expired at `deadline` (now `nowTs`)
    error SignedCallExpired(address operator, uint256 deadline, uint256 nowTs);
    /// @notice the signed call of `operator` is for attempt `signed` of job `jobId`, which is at attempt `current`
    error SignedCallStale(address operator, uint256 jobId, uint256 signed, uint256 current);

    // TEE attestation
    /// @notice verifier `verifier` is not allowed by the blueprint developer
    error VerifierNotAllowed(address verifier);
    /// @notice only the blueprint developer `developer` may do this (caller `caller`)
    error NotDeveloper(address caller, address developer);
    /// @notice `count` attestation verifiers allowed already, the most is `max`
    error TooManyVerifiers(uint256 count, uint256 max);
    /// @notice verifier `verifier` has no code
    error VerifierHasNoCode(address verifier);
    /// @notice extension `extension` has no code
    error ExtensionHasNoCode(address extension);
    /// @notice the verifier returned an attestation that expires at `expiresAt` (now `nowTs`)
    error AttestationExpired(uint256 expiresAt, uint256 nowTs);

    // Payment tokens (jobs escrowed in an ERC-20 token).

    /// @notice token `token` is not an allowed payment token
    error TokenNotAllowed(address token);
    /// @notice `count` payment tokens were already allowed, at most `max` may ever be
    error TooManyPaymentTokens(uint256 count, uint256 max);
    /// @notice `token` is not a contract
    error NotAToken(address token);
    /// @notice a job's owner must not be the zero address
    error ZeroOwner();

    // Challenges
    /// @notice epoch `epoch` of job `jobId` has nothing to challenge yet (reveals still open)
    error NothingToChallenge(uint256 jobId, uint256 epoch);
    /// @notice the challenge window closed at `closedAt` (now `nowTs`)
    error ChallengeWindowClosed(uint256 closedAt, uint256 nowTs);
    /// @notice job `jobId`'s certified vote can be challenged until `closesAt`: finalize after it
    error ChallengeWindowOpen(uint256 jobId, uint256 closesAt);
    /// @notice epoch `epoch` of job `jobId` is challenged and not resolved yet
    error ChallengeUnresolved(uint256 jobId, uint256 epoch);
    /// @notice `account` is neither a registered operator nor the job's caller
    error NotAChallenger(address account);
    /// @notice a challenge bonds `expected`, not `sent`
    error WrongChallengeBond(uint256 expected, uint256 sent);
    /// @notice epoch `epoch` of job `jobId` was already challenged by `challenger`
    error AlreadyChallenged(uint256 jobId, uint256 epoch, address challenger);
    /// @notice epoch `epoch` of job `jobId` is not challenged
    error NotChallenged(uint256 jobId, uint256 epoch);
    /// @notice `account` is not a drawn referee (or not in the step it tries) of job `jobId`'s challenge
    error NotAReferee(uint256 jobId, address account);
    /// @notice the referees are drawn from the hash of block `seedBlock`, not mined yet (now `blockNumber`)
    error SeedNotMined(uint256 seedBlock, uint256 blockNumber);
    /// @notice the referees of epoch `epoch` of job `jobId` were drawn already
    error RefereesDrawnAlready(uint256 jobId, uint256 epoch);
    /// @notice a verdict's findings name member bits at or above the member count `members`
    error FindingsOutOfRange(uint256 findings, uint256 members);
    /// @notice this step of the challenge runs from `opensAt` to `closesAt` (now `nowTs`)
    error NotInPhase(uint256 opensAt, uint256 closesAt, uint256 nowTs);
    /// @notice the challenge of epoch `epoch` of job `jobId` is resolved
    error ChallengeResolvedAlready(uint256 jobId, uint256 epoch);
    /// @notice a challenge game needs an odd `refereeCount` (1..31) and a `challengeBond`
    error InvalidChallengeParams(uint256 refereeCount, uint256 challengeBond);
    /// @notice on chain `chainId` (not a development chain: 31337, 1337) the challenge window
    /// (`challengeWindow`) and the seat draw (`seatDrawWindow`) must both be on
    error TrustSwitchedOff(uint256 chainId, uint256 challengeWindow, uint256 seatDrawWindow);
    /// @notice this hook takes no ether (sent `value`)
    error EtherNotAccepted(uint256 value);

    // Seat draw
    /// @notice job `jobId`'s seats are drawn at `drawAt` (0: not scheduled, fewer than
    /// `minOperators` applied), now `nowTs`
    error SeatDrawNotDue(uint256 jobId, uint256 drawAt, uint256 nowTs);
    /// @notice job `jobId`'s seat applications closed at `drawAt`: its draw is due
    error SeatApplicationsClosed(uint256 jobId, uint256 drawAt);
    /// @notice job `jobId` has 32 applicants and the lightest weighs
    /// `lightest`: an applicant weighing `weight` (capped self-stake) must weigh more
    error ApplicantsFull(uint256 jobId, uint256 lightest, uint256 weight);

    // ---------------------------------------------------------------- events

    /// @notice `operator` registered with `stake` wei of self-stake.
    event OperatorRegistered(address indexed operator, bytes32 peerKey, uint256 stake);
    /// @notice `operator` replaced its peer key, addresses, hardware and price ask.
    event OperatorUpdated(address indexed operator, bytes32 peerKey, uint256 minPricePerEpoch);
    /// @notice `operator` now takes seats only in jobs paying at least `ask` per operator-epoch in
    /// `token` (address(0): wei of ether; otherwise the token's base units).
    event AskUpdated(address indexed operator, address indexed token, uint256 ask);
    /// @notice `operator` deregistered; all its self-stake started unbonding.
    event OperatorDeregistered(address indexed operator);
    /// @notice `operator` voided its signed calls with nonce `nonce` (`cancelSignedCalls`).
    event SignedCallsCancelled(address indexed operator, uint256 nonce);
    /// @notice `account` added `amount` wei to `operator`'s stake pool, receiving `shares` shares.
    event Staked(address indexed operator, address indexed account, uint256 amount, uint256 shares);
    /// @notice `amount` wei of `account`'s stake with `operator` started unbonding until `unlockAt`.
    event UnbondingQueued(address indexed operator, address indexed account, uint256 amount, uint64 unlockAt);
    /// @notice `account`'s unbonded stake with `operator` (`amount` wei) was credited to it.
    event Unbonded(address indexed operator, address indexed account, uint256 amount);
    /// @notice `account` claimed `amount` wei of staking rewards from `operator`'s pool.
    event RewardsClaimed(address indexed operator, address indexed account, uint256 amount);
    /// @notice `caller` created job `jobId`, escrowing `escrow` wei.
    event JobCreated(uint256 indexed jobId, address indexed caller, Method method, uint256 escrow);
    /// @notice Job `jobId` was cancelled; `refund` wei were credited to its caller.
    event JobCancelled(uint256 indexed jobId, uint256 refund);
    /// @notice Operator `operator` will not take job `jobId`: `reason` a short code (`ask`,
    /// `capacity`, `preflight`, `tee`), `detail` a line for the job's caller.
    event JobDeclined(uint256 indexed jobId, address indexed operator, bytes32 reason, string detail);
    /// @notice The caller of running job `jobId` asked it to end once epoch `epoch` settles:
    /// that epoch is settled (paid or slashed) as usual, then the job closes `Cancelled` and
    /// the escrow no epoch earned is refunded to the caller (`JobCancelled`).
    event CancelRequested(uint256 indexed jobId, uint256 epoch);
    /// @notice `operator` joins job `jobId` from epoch `effectiveEpoch`.
    event JoinRequested(uint256 indexed jobId, address indexed operator, uint256 effectiveEpoch);
    /// @notice `operator` leaves job `jobId` from epoch `effectiveEpoch`.
    event LeaveRequested(uint256 indexed jobId, address indexed operator, uint256 effectiveEpoch);
    /// @notice Epoch `epoch` of job `jobId` started with `memberCount` members from
    /// `startCheckpoint`; checkpoints are due by `deadline`.
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
    /// @notice `operator` committed to a vote (hidden until revealed) for epoch `epoch` of job `jobId`.
    event CheckpointCommitted(
        uint256 indexed jobId, uint256 indexed epoch, address indexed operator, bytes32 commitment
    );
    /// @notice `operator` revealed its vote `checkpoint` (`voteKey` names the vote with its
    /// participation) for epoch `epoch` of job `jobId`, made from the transcript file of
    /// sha256 `transcript` (what the referees of a challenge judge the vote against).
    event CheckpointRevealed(
        uint256 indexed jobId,
        uint256 indexed epoch,
        address indexed operator,
        bytes32 checkpoint,
        bytes32 voteKey,
        bytes32 transcript
    );
    /// @notice Epoch `epoch` of job `jobId` reached quorum on `checkpoint`; `paidMembers` members were paid.
    event EpochFinalized(uint256 indexed jobId, uint256 indexed epoch, bytes32 checkpoint, uint256 paidMembers);
    /// @notice Epoch `epoch` of job `jobId` is being settled in pieces: `settled` of `members`
    /// members so far (a hook settles `HOOK_SETTLE_BATCH` per call).
    event EpochSettling(uint256 indexed jobId, uint256 indexed epoch, uint256 settled, uint256 members);
    /// @notice Epoch `epoch` of job `jobId` ended without quorum (`failedEpochs` in a row).
    event EpochFailed(uint256 indexed jobId, uint256 indexed epoch, uint256 failedEpochs);
    /// @notice `operator` earned `price` wei for epoch `epoch` of job `jobId`, split among operator,
    /// stakers, protocol and developer.
    event OperatorPaid(uint256 indexed jobId, uint256 indexed epoch, address indexed operator, uint256 price);
    /// @notice `finalizer` earned `amount` (in the job's currency) out of the protocol's share
    /// for settling epoch `epoch` of job `jobId`.
    event FinalizerPaid(uint256 indexed jobId, uint256 indexed epoch, address indexed finalizer, uint256 amount);
    /// @notice `amount` wei of `operator`'s pool (active and unbonding stake) were slashed for
    /// `reason` in epoch `epoch` of job `jobId`, triggered by `reporter`.
    event Slashed(
        address indexed operator,
        uint256 indexed jobId,
        uint256 epoch,
        SlashReason reason,
        uint256 amount,
        address reporter
    );
    /// @notice `reporter` proved that member `operator` of epoch `epoch` of job `jobId` signed two
    /// different packets (or commitments) for round `round`: it is slashed at the fabrication
    /// rate, and not paid, when the epoch settles.
    event EquivocationProven(
        uint256 indexed jobId, uint256 indexed epoch, address indexed operator, uint256 round, address reporter
    );
    /// @notice Job `jobId` completed with `finalCheckpoint`; `refund` wei of unearned escrow were
    /// credited to its caller.
    event JobCompleted(uint256 indexed jobId, bytes32 finalCheckpoint, uint256 refund);
    /// @notice Job `jobId` failed; `refund` wei of remaining escrow were credited to its caller.
    event JobFailed(uint256 indexed jobId, uint256 refund);
    /// @notice A quorum voted epoch `epoch` of job `jobId` unworkable: nobody was slashed,
    /// `compensated` members were credited `compensation` wei each and the caller `refund` wei.
    event JobAborted(
        uint256 indexed jobId, uint256 indexed epoch, uint256 compensated, uint256 compensation, uint256 refund
    );
    /// @notice `amount` wei were credited to `account`, claimable with `withdraw()`.
    event Credited(address indexed account, uint256 amount);
    /// @notice `account` withdrew `amount` wei of credit.
    event Withdrawn(address indexed account, uint256 amount);

    // TEE attestation
    /// @notice Verifier `verifier` accepted a TEE attestation of `operator` (TEE type `teeType`,
    /// measurement `measurement`) bound to peer key `peerKey`, valid until `expiresAt`.
    event AttestationSubmitted(
        address indexed operator,
        address indexed verifier,
        uint8 teeType,
        bytes32 measurement,
        bytes32 peerKey,
        uint64 expiresAt
    );
    /// @notice The blueprint developer allowed (or disallowed) attestation verifier `verifier`.
    event AttestationVerifierSet(address indexed verifier, bool allowed);

    // Payment tokens: amounts in these events are in the token's own units.

    /// @notice The blueprint developer allowed (or stopped allowing) `token` for new jobs.
    event PaymentTokenSet(address indexed token, bool allowed);
    /// @notice Job `jobId` is priced and escrowed in `token`: `payer` paid its `escrow` (its
    /// `JobCreated` names the job's owner). Every amount of the job is in `token`.
    event JobEscrowedInToken(uint256 indexed jobId, address indexed token, address indexed payer, uint256 escrow);
    /// @notice `amount` of `token` were credited to `account`, claimable with `withdrawToken`.
    event TokenCredited(address indexed token, address indexed account, uint256 amount);
    /// @notice `account` withdrew `amount` of its `token` credit.
    event TokenWithdrawn(address indexed token, address indexed account, uint256 amount);

    // Challenges
    /// @notice `challenger` bonded to dispute the certified vote `certifiedKey` of epoch `epoch`
    /// of job `jobId`; it serves the epoch's transcript file with sha256 `transcript`.
    event Challenged(
        uint256 indexed jobId,
        uint256 indexed epoch,
        address indexed challenger,
        bytes32 certifiedKey,
        bytes32 transcript
    );
    /// @notice `member`, a voter of the challenged attempt, serves the transcript file with
    /// sha256 `transcript`: the referees re-execute the union of every posted transcript.
    event TranscriptPosted(uint256 indexed jobId, uint256 indexed epoch, address indexed member, bytes32 transcript);
    /// @notice `referees` were drawn by capped self-stake among the registered outsiders of
    /// the challenged job, from the hash of the block after the challenge's.
    event RefereesDrawn(uint256 indexed jobId, uint256 indexed epoch, address[] referees);
    /// @notice The seed block's hash was out of the chain's 256-block reach when the draw ran:
    /// the draw uses block `seedBlock`'s hash instead (a block not yet mined then).
    event RefereeSeedRenewed(uint256 indexed jobId, uint256 indexed epoch, uint256 seedBlock);
    /// @notice `referee` committed its hidden verdict.
    event VerdictCommitted(uint256 indexed jobId, uint256 indexed epoch, address indexed referee);
    /// @notice `referee` revealed the verdict `checkpoint` (vote key `voteKey`) it re-executed
    /// and its `findings` (bit i: member i consistent with its own transcript; bit 128 + i:
    /// member i caught by replay).
    event VerdictRevealed(
        uint256 indexed jobId,
        uint256 indexed epoch,
        address indexed referee,
        bytes32 checkpoint,
        bytes32 voteKey,
        uint256 findings
    );
    /// @notice The challenge of epoch `epoch` of job `jobId` ended with the referees' majority on
    /// `verdictKey` (zero: none); `overturned`: it differs from the certified vote, which the
    /// epoch no longer settles on.
    event ChallengeResolved(uint256 indexed jobId, uint256 indexed epoch, bytes32 verdictKey, bool overturned);

    // Seat draw
    /// @notice `minOperators` applied for epoch `epoch` of job `jobId`: its seats are drawn by
    /// stake at `drawAt` (`drawSeats`), and more operators may apply until then.
    event SeatDrawScheduled(uint256 indexed jobId, uint256 indexed epoch, uint256 drawAt);
    /// @notice The seat draw of job `jobId` is sealed: the applicants and their weights stand
    /// as of this block, and the hash of block `seedBlock` (not mined yet) draws the seats.
    event SeatDrawSealed(uint256 indexed jobId, uint256 indexed epoch, uint256 seedBlock);
    /// @notice `seated` were drawn by stake among the applicants for epoch `epoch` of job `jobId`.
    event SeatsDrawn(uint256 indexed jobId, uint256 indexed epoch, address[] seated);
    /// @notice `operator` applied for epoch `epoch` of job `jobId` and holds no seat: it was not
    /// drawn, or a heavier applicant took its place in a full list; its bond is released.
    event SeatNotDrawn(uint256 indexed jobId, uint256 indexed epoch, address indexed operator);
    /// @notice The boundary into `epoch` came before its vacancy draw's seed block was mined:
    /// the `queued` applicants wait for the next boundary.
    event VacancyDrawDeferred(uint256 indexed jobId, uint256 indexed epoch, uint256 queued);
}

/// @title IDistributedTrainingBSMStaking
/// @notice Operators' registration and the stake pools (implemented by BSMStakingActions in the
/// hooks extension, reached through the BSM's and the views extension's fallbacks).
interface IDistributedTrainingBSMStaking is IDistributedTrainingBSMTypes {
    // ---------------------------------------------------------------- operators and stake

    /// @notice Registers the sender as an operator with `msg.value` as self-stake.
    /// @param peerKey Ed25519 public key of the node's libp2p identity; its peer id is the
    /// identity multihash `0x002408011220 || peerKey`. 32 bytes instead of the 38-byte id keep
    /// registration near 200k gas.
    /// @param multiaddrs libp2p addresses of the operator's node.
    /// @param hardware free-form description (e.g. "cpu:2", "gpu:a100x8").
    /// @param minPricePerEpoch lowest `pricePerOperatorEpoch` the operator accepts.
    function registerOperator(
        bytes32 peerKey,
        string[] calldata multiaddrs,
        string calldata hardware,
        uint256 minPricePerEpoch
    ) external payable;

    /// @notice Replaces the sender's peer key, addresses, hardware and price ask. A new peer key
    /// deletes the sender's TEE attestation (it was bound to the old key).
    function updateOperator(
        bytes32 peerKey,
        string[] calldata multiaddrs,
        string calldata hardware,
        uint256 minPricePerEpoch
    ) external;

    /// @notice Sets the sender's ask in `token`: the least `pricePerOperatorEpoch` of a job
    /// priced in it that the sender may join. address(0) is ether (the ask `registerOperator` and
    /// `updateOperator` set, in wei); any other `token` must be an allowed payment token and the
    /// ask is in its base units. Without an ask in a token, an operator asking nothing in ether
    /// joins jobs in that token at any price and one asking something joins none
    /// (`NoAskInToken`). Asks in tokens outlive deregistration.
    function updateAsk(address token, uint256 ask) external;

    /// @notice `operator`'s ask in `token` (address(0): ether): whether it joins jobs priced in
    /// `token` at all and the least price it joins them at (see `updateAsk`).
    function askIn(address operator, address token) external view returns (bool takes, uint256 ask);

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
}

/// @title IDistributedTrainingBSMActions
/// @notice The state-changing functions the BSM implements itself: jobs, epochs, credits.
interface IDistributedTrainingBSMActions is IDistributedTrainingBSMTypes {
    /// @notice Sends the sender all its credits.
    function withdraw() external;

    // ---------------------------------------------------------------- jobs

    /// @notice Creates a job; `msg.value` must equal price x maxOperators x totalEpochs.
    function createJob(JobSpec calldata spec) external payable returns (uint256 jobId);

    /// @notice Ends a job and credits its remaining escrow to the caller. An `Open` job: the
    /// caller may cancel it at any time (`Cancelled`); anyone may fail it (`Failed`) once it has
    /// started and then waited `openTimeout` for members. A `Running` job (caller only, once):
    /// the epoch in progress still settles as usual, its members paid or slashed by
    /// `finalizeEpoch`, and then, instead of the next epoch starting, the job closes
    /// `Cancelled` and the escrow no epoch earned is refunded (`CancelRequested`, then
    /// `JobCancelled`); if that epoch was the last, the job completes as usual.
    function cancelJob(uint256 jobId) external;

    /// @notice Joins a job, bonding `seatBond` of the sender's free self-stake; takes effect at
    /// the next epoch boundary (or starts the epoch when it brings the job to max(2, minOperators)).
    function joinJob(uint256 jobId) external;

    /// @notice Leaves a job at the next epoch boundary (immediately while the job is `Open`).
    function leaveJob(uint256 jobId) external;

    /// @notice Commits the sender's hidden vote for the epoch in progress, before its deadline.
    /// @param commitment `commitmentHash(jobId, epoch, sender, checkpoint, participation,
    /// transcript, salt)`.
    function commitCheckpoint(uint256 jobId, uint256 epoch, bytes32 commitment) external;

    /// @notice Reveals the sender's committed vote. Reveals open after the commit deadline, or
    /// as soon as every member committed, and close `revealWindow` after the deadline. A
    /// commitment never revealed counts as no vote (dropout).
    /// @param checkpoint the checkpoint hash, or `UNWORKABLE` (data or model unavailable or
    /// failing its hash; participation is then ignored).
    /// @param participation sync rounds applied from each member, in `getMembers` order.
    /// @param transcript sha256 of the epoch's transcript file the vote was made from (the
    /// member serves it): bound before any vote is seen, so a challenge judges each voter
    /// against the file it committed to, not one written later.
    function revealCheckpoint(
        uint256 jobId,
        uint256 epoch,
        bytes32 checkpoint,
        uint32[] calldata participation,
        bytes32 transcript,
        bytes32 salt
    ) external;

    /// @notice Settles the epoch in progress (anyone; after all members revealed or the reveal
    /// deadline). Slashed stake goes to the treasury, all of it; a sender that is neither the
    /// job's caller nor in the job earns `reporterBountyBps` of the protocol's share of the
    /// epoch's payments, at most `maxReporterBounty` per epoch, whoever is slashed.
    function finalizeEpoch(uint256 jobId, uint256 epoch) external;

    /// @notice Runs a Tangle hook's operator action inside the BSM; only the BSM itself (its
    /// hooks extension, after checking who the operator is) may call it.
    function hookAction(uint8 action, address operator, bytes calldata args) external;
}

/// @title IDistributedTrainingBSMViews
/// @notice Every view of the BSM (implemented by DistributedTrainingBSMViews, reached through
/// DistributedTrainingBSM's fallback).
interface IDistributedTrainingBSMViews is IDistributedTrainingBSMTypes {
    /// @notice A registered operator says why it will not take job `jobId` (`JobDeclined`):
    /// the caller reads it from the chain after the operator's node is gone. Changes no state;
    /// `detail` is at most 256 bytes.
    function declineJob(uint256 jobId, bytes32 reason, string calldata detail) external;

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
    /// @notice Staking rewards `account` can claim from `operator`'s pool. Stake earns from the
    /// start of the second reward period after its deposit (see `rewardPeriod`).
    function pendingRewards(address operator, address account) external view returns (uint256);
    /// @notice Longest `epochDuration` a job may ask for: unbondingPeriod / 4 - startGrace.
    function maxEpochDuration() external view returns (uint256);
    /// @notice Length of a staking reward period: unbondingPeriod / 2. A deposit earns from the
    /// start of the second period after it, so it was present for every epoch it is paid for;
    /// an epoch finalized more than a period after it began pays its pool share to the treasury.
    function rewardPeriod() external view returns (uint256);
    function creditOf(address account) external view returns (uint256);
    function getJob(uint256 jobId) external view returns (JobSpec memory spec, JobState memory state);
    /// @notice Whether the caller asked job `jobId` to end at its current epoch's boundary
    /// (`cancelJob` on a running job); stays true once the job closed.
    function cancelRequested(uint256 jobId) external view returns (bool);
    /// @notice Members of the epoch in progress, in participation order (join order, with
    /// leavers compacted out at each boundary). Nodes sort a copy for shard assignment.
    function getMembers(uint256 jobId) external view returns (address[] memory);
    /// @notice Operators whose join takes effect at the next boundary.
    function getPendingJoins(uint256 jobId) external view returns (address[] memory);
    function isLeaving(uint256 jobId, address operator) external view returns (bool);
    /// @notice Finalized checkpoint of `epoch` (the start state of `epoch + 1`).
    function epochCheckpoint(uint256 jobId, uint256 epoch) external view returns (bytes32);
    /// @notice `operator`'s commitment and revealed vote in the epoch in progress (zero when none).
    function submissionOf(uint256 jobId, address operator)
        external
        view
        returns (bytes32 commitment, bytes32 checkpoint, bytes32 voteKey);
    /// @notice Members that committed and revealed in the epoch in progress.
    function voteCounts(uint256 jobId) external view returns (uint256 committed, uint256 revealed);
    /// @notice Commit deadline of the epoch in progress (0 when not running).
    function epochDeadline(uint256 jobId) external view returns (uint64);
    /// @notice Reveal deadline of the epoch in progress: `epochDeadline + revealWindow`.
    function revealDeadline(uint256 jobId) external view returns (uint64);
    /// @notice What a member commits to: keccak256(abi.encode(jobId, epoch, operator,
    /// checkpoint, participation, evidence, salt)). Binding the operator makes a copied
    /// commitment useless. `evidence`: a member's transcript sha256; a referee's bitmap of
    /// consistent voters.
    function commitmentHash(
        uint256 jobId,
        uint256 epoch,
        address operator,
        bytes32 checkpoint,
        uint32[] calldata participation,
        bytes32 evidence,
        bytes32 salt
    ) external pure returns (bytes32);
    /// @notice The reserved vote for an epoch that cannot be done: data or model unavailable or
    /// failing its hash ("UNWORKABLE", left aligned).
    function UNWORKABLE() external pure returns (bytes32);
    /// @notice Self-stake of `operator` bonded by its seats (the sum of its jobs' `seatBond`).
    function bondedOf(address operator) external view returns (uint256);
    /// @notice Next nonce `operator` must sign into an EIP-712 `OperatorCall` sent through `onJobCall`.
    function operatorNonce(address operator) external view returns (uint256);
    /// @notice Voids every signed call of the sender not yet sent (its nonce `operatorNonce`):
    /// an operator that signed a call it no longer wants cancels it before anyone relays it.
    function cancelSignedCalls() external;
    /// @notice Running totals whose sum equals the contract balance.
    function accounting()
        external
        view
        returns (uint256 staked, uint256 unbonding, uint256 escrow, uint256 credits, uint256 rewardReserve);

    // ---------------------------------------------------------------- equivocation
    // Run in the views extension (cold code), on the BSM's storage.

    /// @notice Records that a member of job `jobId`'s current epoch attempt equivocated:
    /// `first` and `second` are two gossip envelopes (docs/protocol.md section 2) it signed for
    /// this chain, this contract, this job and attempt and one round, naming two different
    /// packets (commitments or packet chunks). Anyone may report; the member is slashed at the
    /// fabrication rate and not paid when the attempt settles. Reverts with
    /// `MalformedEnvelope`, `ProofForAnotherJob`, `ProofNotCurrentAttempt`,
    /// `EnvelopeNotSignedBySender`, `NotAnEquivocation`, `NotMember` or `EquivocationKnown`.
    function reportEquivocation(uint256 jobId, bytes calldata first, bytes calldata second) external;

    /// @notice Members of job `jobId`'s current attempt proven to equivocate (bit i: member i).
    function equivocators(uint256 jobId) external view returns (uint256 members);

    // ---------------------------------------------------------------- TEE attestation
    // Run in the views extension (cold code), on the BSM's storage.

    /// @notice Records the sender's TEE attestation: the allowed `verifier` must accept
    /// `evidence` for the sender and its registered peer key (`IAttestationVerifier.verify`).
    /// Replaces any earlier attestation. It counts for `teeRequired` joins while `verifier` stays
    /// allowed, until it expires, while the sender keeps that peer key, and while it was issued
    /// no earlier than the verifier's `validSince()`.
    function submitAttestation(address verifier, bytes calldata evidence) external;

    /// @notice Allows or disallows an attestation verifier (blueprint developer only; at most 8
    /// allowed at once). Disallowing one voids every attestation it accepted, for later joins.
    function setAttestationVerifier(address verifier, bool allowed) external;

    /// @notice Whether the blueprint developer allows `verifier`.
    function isAttestationVerifier(address verifier) external view returns (bool);

    /// @notice `operator`'s recorded attestation and whether it counts now for a `teeRequired`
    /// join (`valid`).
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
        );
}

/// @title IDistributedTrainingBSMTokens
/// @notice Jobs priced and escrowed in an ERC-20 token the blueprint developer allowed
/// (implemented by BSMTokenPayments in the views extension, reached through the BSM's
/// fallback). Such a job's escrow, refunds, unworkable compensation and 40/20/20/20 split are
/// in its token: credits and staker rewards are kept per token and withdrawn with
/// `withdrawToken`. Stake, slashing and the finalizer's bounty stay in ether.
interface IDistributedTrainingBSMTokens is IDistributedTrainingBSMTypes {
    /// @notice Creates a job priced in `token`: `pricePerOperatorEpoch` is in the token's units
    /// (`seatBond` stays in wei of self-stake). Same validation as `createJob`. The sender pays the
    /// escrow, price x maxOperators x totalEpochs, with `transferFrom` (approve it first); the
    /// BSM's balance of `token` must grow by exactly that. `owner` is the job's caller: it may
    /// cancel the job and receives its refunds.
    function createJobWithToken(JobSpec calldata spec, address token, address owner) external returns (uint256 jobId);

    /// @notice Allows `token` for new jobs, or stops allowing it (jobs already escrowed in it
    /// run on). Blueprint developer only; at most `MAX_PAYMENT_TOKENS` (4) distinct tokens ever.
    function setPaymentToken(address token, bool allowed) external;

    /// @notice Sends the sender all its credit in `token`.
    function withdrawToken(address token) external;

    /// @notice Credit of `account` in `token`, claimable with `withdrawToken`.
    function tokenCreditOf(address token, address account) external view returns (uint256);
    /// @notice Staking rewards in `token` that `account` can claim from `operator`'s pool
    /// (`claimRewards` credits rewards in ether and every token at once).
    function pendingTokenRewards(address token, address operator, address account) external view returns (uint256);
    /// @notice Running totals of `token` whose sum equals the BSM's balance of it.
    function tokenAccounting(address token)
        external
        view
        returns (uint256 escrow, uint256 credits, uint256 rewardReserve);
    /// @notice Token job `jobId` is priced in; address(0) for ether.
    function jobToken(uint256 jobId) external view returns (address);
    /// @notice Whether new jobs may be priced in `token`.
    function isPaymentToken(address token) external view returns (bool);
    /// @notice Every token ever allowed, in the order it was first allowed (allowed now or not).
    function paymentTokens() external view returns (address[] memory);
}

/// @title IDistributedTrainingBSMChallenges
/// @notice Certified is not final: within `challengeWindow` of an epoch's last reveal anyone
/// registered (or the job's caller) may bond `challengeBond` and dispute its certified vote.
/// Registered operators outside the job apply as referees, bonding self-stake; `refereeCount`
/// of them are drawn by stake, re-execute the epoch from its signed transcript (aggregation
/// only: the result is one bit string) and commit, then reveal, the (checkpoint,
/// participation) vote they get. The referees' majority is the verdict: the epoch settles on
/// it as if a quorum had voted it (members that voted otherwise are slashed for fabrication),
/// the challenger gets its bond back if the verdict overturns the certified vote, three
/// quarters of it if there is none (a dispute that changed nothing delayed every member's pay),
/// and loses it to the treasury if it upholds it; referees off the majority are slashed.
/// Each phase (apply, commit, reveal) lasts `challengeWindow`; the epoch cannot be finalized
/// while its challenge is open. Implemented in the views extension.
interface IDistributedTrainingBSMChallenges is IDistributedTrainingBSMTypes {
    /// @notice Disputes the certified vote of epoch `epoch` of job `jobId`, or takes an attempt
    /// whose reveals closed without a quorum to the referees (no free veto: their verdict
    /// settles it as a quorum would, and a member whose own file does not lead to its vote is
    /// a fabricator), bonding exactly `challengeBond` wei; `transcript` is the sha256 of the
    /// transcript file the sender serves.
    function challenge(uint256 jobId, uint256 epoch, bytes32 transcript) external payable;
    /// @notice A member that voted in the challenged attempt names the transcript file it serves
    /// (during the first phase), so that a challenger cannot hide packets from the referees:
    /// they re-execute the union of the challenger's and every posted transcript's packets.
    function postTranscript(uint256 jobId, uint256 epoch, bytes32 transcript) external;
    /// @notice Draws the challenge's `refereeCount` referees; anyone may call it once the block
    /// after the challenge's is mined. Nobody applies and nobody chooses: each operator that was
    /// registered when the job was created and is outside the job (not a member, its caller or
    /// the challenger) is drawn with a probability proportional to its self-stake capped at
    /// `SEAT_WEIGHT_CAP` x `minStake`, the lesser of its weight then and at the challenge's
    /// block, from the hash of the next block (unknown when the weights were fixed): operators
    /// registered, or stake added, once a job exists never weigh in its juries. The draw tries
    /// `64 x refereeCount` picks at most; a jury below `refereeCount / 2 + 1` decides nothing
    /// (the certified vote stands).
    function drawReferees(uint256 jobId, uint256 epoch) external;
    /// @notice A drawn referee commits `commitmentHash(jobId, epoch, referee, checkpoint,
    /// participation, bytes32(findings), salt)` (it draws the referees if nobody did).
    function commitVerdict(uint256 jobId, uint256 epoch, bytes32 commitment) external;
    /// @notice Reveals a committed verdict (`checkpoint` may be `UNWORKABLE()`) and the
    /// referee's `findings` on the members. Bit i set: member i's own transcript file (the one
    /// its vote names) re-executes to the vote it revealed (consistent). Bit 128 + i set: a
    /// round of member i replayed from the private state it committed to gives another packet
    /// than the one it sent, or nobody serves that state (caught). A consistent voter is paid
    /// whatever the verdict (which packets reached whom in time cannot be proven after the
    /// epoch, so a majority's own file cannot make an honest dissenter a fabricator); a caught
    /// member is slashed at the fabrication rate (`FailedReplay`) and not paid, whatever it voted.
    function revealVerdict(
        uint256 jobId,
        uint256 epoch,
        bytes32 checkpoint,
        uint32[] calldata participation,
        uint256 findings,
        bytes32 salt
    ) external;
    /// @notice Ends the challenge once every drawn referee revealed or the reveal phase closed:
    /// settles the bond and the referees. Anyone may call it. With a verdict, the referees
    /// that revealed it share half the bond, paid from what the losing side forfeits (the
    /// slashed stake when the verdict overturned the vote or caught a member, else the
    /// challenger's bond); referees off the verdict or that committed and never revealed are
    /// slashed at the fabrication rate, drawn referees that never committed at the dropout
    /// rate. Without a verdict (no majority, or too small a jury) only a referee that
    /// committed and never revealed is slashed. The
    /// challenger's bond comes back when the verdict overturns the certified vote, when the
    /// referees caught a member (a fraud claim proven by replay), or when the challenger voted
    /// another vote and the verdict finds it consistent (a voter of the verdict disputing it
    /// pays like anyone); without a verdict three quarters of it come back and a quarter goes
    /// to the treasury.
    function resolveChallenge(uint256 jobId, uint256 epoch) external;
    /// @notice The challenge of epoch attempt `attempt` (see `JobState.attempt`).
    function challengeOf(uint64 attempt) external view returns (ChallengeInfo memory);
    /// @notice The vote key a quorum certified for the current attempt of job `jobId` (zero: no
    /// quorum, or reveals still open) and until when it may be challenged (and cannot be
    /// finalized unchallenged; 0 while reveals are open). A member compares its own vote key,
    /// `keccak256(abi.encode(checkpoint, participation))`, with it.
    function certifiedVote(uint256 jobId) external view returns (bytes32 voteKey, uint256 challengeCloses);
}

/// @title IDistributedTrainingBSMSeats
/// @notice Seats by stake, not by speed: with `seatDrawWindow > 0`, joining an `Open` job is
/// applying for a seat. Once `minOperators` applied, applications stay open `seatDrawWindow`
/// seconds (up to 32 applicants; when full, a heavier applicant displaces the
/// lightest); then nobody joins or leaves, and anyone calls `drawSeats` twice: the first call
/// seals the draw (the applicants' weights stand as of its block) and names the next block,
/// whose hash nobody knows yet, as the seed; the second, once that block is mined, draws
/// `maxOperators` of them without replacement, each pick weighted by its self-stake capped at
/// `SEAT_WEIGHT_CAP` x `minStake` as of the sealing block, releases the others and starts the
/// epoch. No stake moved and no transaction chosen after the seal changes the draw.
/// Vacancies the same way: joining a `Running` job queues for a seat of the next epoch (up to
/// 32 members and queued, a heavier newcomer displacing the lightest queued one). The epoch's
/// first reveal seals the queue (nobody joins or leaves it until the boundary; weights as of
/// that block, the next block's hash the seed); at the boundary, when more are queued than
/// seats are free, the free seats are drawn among the queue as above and the others stay
/// queued, bonded, for the next boundary (or leave). A boundary that comes before the seed
/// block is mined seats nobody from the queue. Implemented in the hooks extension.
interface IDistributedTrainingBSMSeats is IDistributedTrainingBSMTypes {
    /// @notice Seals, then (called again once the seed block is mined) draws the seats of `Open`
    /// job `jobId` among its applicants and starts its epoch; anyone may call it once
    /// `seatDrawAt(jobId)` has passed.
    function drawSeats(uint256 jobId) external;
    /// @notice When the seats of job `jobId` are drawn (0: no draw scheduled).
    function seatDrawAt(uint256 jobId) external view returns (uint256);
    /// @notice An applicant's weight in the draw: its self-stake, capped at
    /// `SEAT_WEIGHT_CAP` x `minStake` (one heavy operator cannot crowd out the others).
    function seatWeight(address operator) external view returns (uint256);
    /// @notice Applicants weigh their self-stake up to this many `minStake` in a seat draw.
    function SEAT_WEIGHT_CAP() external view returns (uint256);
    /// @notice Seats the queued applicants of running job `jobId` in its free seats at an epoch
    /// boundary (the staying members already written) and returns how many it seated: all
    /// when they fit, else as many as seats are free, drawn by stake (the others stay
    /// queued), or 0 when the sealed seed block is not mined yet; without seat draws
    /// (`seatDrawWindow` 0) the first of the queue, first come. `inPieces` (the core's
    /// FINALIZE hook) seats at most 2, the rest at later boundaries, so that the call fits
    /// the core's gas cap. Only the BSM itself calls it, from the boundary.
    function drawVacancies(uint256 jobId, bool inPieces) external returns (uint256 seated);
    /// @notice Makes room in a full list of applicants (an `Open` job's applicants, a running
    /// job's queue: never its members) for `newcomer` by releasing the lightest applicant,
    /// only if `newcomer` weighs more (`ApplicantsFull` otherwise): crowding a draw costs
    /// stake, not addresses. Only the BSM itself calls it, from a join.
    function displaceLightest(uint256 jobId, address newcomer) external;
}

/// @title IDistributedTrainingBSM
/// @notice Membership, jobs, epochs, checkpoint commitments, fees and slashing for distributed
/// training with DeMo. Operators stake and register permissionlessly, stakers delegate to them,
/// callers escrow payment for training jobs, operators train each epoch together, commit and reveal the
/// resulting checkpoint hash; anyone finalizes an epoch once every member revealed or the
/// reveal deadline passed. Each member bonds `seatBond` of self-stake per seat, so every
/// member of a job carries the same bonded stake and a 2/3 quorum of the epoch's bonded stake is
/// the (checkpoint, participation) vote revealed by >= 2/3 of its members: members that agree
/// are paid, members that disagree, stayed silent or did not sync are slashed. Votes are
/// committed hidden and revealed after the deadline, so nobody can copy one.
/// @dev Money is pull-only: every payout is a credit claimed with `withdraw()`. At all times
/// `address(this).balance == staked + unbonding + escrow + credits + rewardReserve` (see
/// `accounting()`).
interface IDistributedTrainingBSM is
    IDistributedTrainingBSMStaking,
    IDistributedTrainingBSMActions,
    IDistributedTrainingBSMViews,
    IDistributedTrainingBSMTokens,
    IDistributedTrainingBSMChallenges,
    IDistributedTrainingBSMSeats
{}
