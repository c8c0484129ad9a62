// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Test, Vm} from "../utils/Test.sol";
import {IBSM} from "../utils/IBSM.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";
import {TestUSD} from "../../src/devnet/TestUSD.sol";
import {DecimalsToken} from "../utils/BadTokens.sol";
import {SignedAttestationVerifier} from "../../src/SignedAttestationVerifier.sol";
import {ISignedAttestationVerifier as V} from "../../src/interfaces/ISignedAttestationVerifier.sol";

interface IMintable {
    function mint(address to, uint256 amount) external;
    function approve(address spender, uint256 amount) external returns (bool);
    function balanceOf(address account) external view returns (uint256);
}

/// Drives random sequences of every state-changing call across several actors and keeps
/// running totals of the ether that entered and left, plus per-epoch settlement checks. Half
/// the jobs are priced in a token (TestUSD with 6 decimals, or a 2-decimal token, paid by a
/// gateway for the caller): their settlement is checked in their token, with running totals of
/// each token that entered and left. An eighth of the jobs require a TEE: only operators holding
/// an unexpired attestation (from the signed-statement verifier) can join them.
contract Handler is Test {
    IBSM public bsm;
    address public core;
    address public treasury;
    address public developer;

    address[] public operators;
    address[] public stakers;
    address[] public actors; // everyone who can hold a credit
    uint256[] public jobs;

    uint256 public ghostIn;
    uint256 public ghostOut;
    uint256 public ghostSlashed;
    uint256 public ghostPaidEpochs;
    uint256 public ghostSplitViolations;
    uint256 public ghostSettlementViolations;
    /// Per-account checks of each settlement: who was paid, slashed, refunded, rewarded.
    uint256 public ghostWhoViolations;
    mapping(address account => uint256) public ghostPaidTo; // operator's 40% shares
    mapping(address account => uint256) public ghostSlashedFrom; // from the operator's pool
    mapping(address account => uint256) public ghostRefundedTo; // unearned escrow, to callers
    mapping(address account => uint256) public ghostBountyTo; // finalizer rewards
    uint256 public ghostCompletedJobs;
    uint256 public ghostFailedRefunds; // failed jobs whose remaining escrow was refunded
    uint256 public ghostShortEpochJobs;
    uint256 public ghostCrossJobVotes; // votes another job had already cast in the same attempt round
    uint256 public ghostAbortedJobs; // jobs a quorum voted UNWORKABLE
    uint256 public ghostExpiredJobs; // started jobs failed by a stranger after the open timeout
    uint256 public ghostWithheldReveals; // commitments never revealed
    TestUSD public usd;
    DecimalsToken public dec2;
    address[] public tokens; // every payment token the jobs use
    address public gateway;
    mapping(address token => uint256) public ghostTokenIn;
    mapping(address token => uint256) public ghostTokenOut;
    mapping(address token => uint256) public ghostJobsIn; // jobs priced in each token
    uint256 public ghostTokenJobs;
    uint256 public ghostTokenPaidEpochs;
    uint256 public ghostHookSettlements; // epochs settled through the core's FINALIZE hook, in pieces
    uint256 public ghostQueuedJoins; // joins while an epoch ran, seated at its boundary
    SignedAttestationVerifier public verifier;
    uint256 internal constant _ATTESTER_KEY = 0xA77E57;
    uint256 public ghostTeeJobs; // jobs that require a TEE
    uint256 public ghostTeeJoins; // seats taken in them, each with a valid attestation
    uint256 public ghostTeeJoinViolations; // a seat taken in one without a valid attestation
    uint256 public ghostChallenges; // certified votes disputed
    uint256 public ghostConsistentVerdicts; // verdicts that found some voter consistent
    uint256 public ghostCaughtVerdicts; // verdicts that caught a member by replay
    uint256 public ghostUncertifiedChallenges; // attempts without a quorum taken to the referees
    uint256 public ghostPaidVerdicts; // verdicts whose referees were paid from the bond
    uint256 public ghostVerdicts; // challenges the referees' majority decided
    uint256 public ghostOverturned; // ... against the certified vote
    uint256 public ghostRefereesSlashed; // referees off the majority, withheld or silent
    uint256 public ghostChallengeViolations; // a bond or a referee slash that went elsewhere
    uint256 public ghostSeatDraws; // epochs whose seats were drawn among applicants
    uint256 public ghostSeatsNotDrawn; // applicants left out of a draw (their bond released)
    uint256 public ghostSeatViolations; // a draw that seated the wrong count or kept a bond
    uint256 public ghostVacancyDraws; // boundaries whose free seats were drawn among a queue
    uint256 public ghostVacancyDeferrals; // boundaries before the seed block: the queue waits
    uint256 public ghostCancelRequests; // callers' cancels of a running job
    uint256 public ghostCancelledRunning; // ... closed Cancelled at the epoch's boundary
    bool internal _cancelAsked; // the job being finalized had a cancel requested
    uint256 internal _jobEscrow; // ... and this escrow before its finalize
    uint256 internal _jobId; // ... and this id

    /// What each member committed to, revealed later.
    struct Hidden {
        bytes32 h;
        uint32[] p;
        bool withhold;
    }

    mapping(uint256 id => mapping(uint64 attempt => mapping(address member => Hidden))) internal _hidden;
    mapping(bytes4 => uint256) public calls;
    /// Registered operators that never take a seat: they referee challenges.
    address[] public referees;

    bytes32 private constant _PAID = keccak256("OperatorPaid(uint256,uint256,address,uint256)");
    bytes32 private constant _SLASHED = keccak256("Slashed(address,uint256,uint256,uint8,uint256,address)");
    bytes32 private constant _ABORTED = keccak256("JobAborted(uint256,uint256,uint256,uint256,uint256)");
    bytes32 private constant _UNWORKABLE = "UNWORKABLE";
    bytes32 private constant _SEATS_DRAWN = keccak256("SeatsDrawn(uint256,uint256,address[])");
    bytes32 private constant _VACANCY_WAITS = keccak256("VacancyDrawDeferred(uint256,uint256,uint256)");

    constructor(IBSM bsm_, address core_, address treasury_, address developer_) {
        bsm = bsm_;
        core = core_;
        treasury = treasury_;
        developer = developer_;
        for (uint256 i; i < 4; ++i) {
            operators.push(makeAddr(string.concat("inv-operator", string(abi.encodePacked(bytes1(uint8(48 + i)))))));
            actors.push(operators[i]);
        }
        for (uint256 i; i < 3; ++i) {
            stakers.push(makeAddr(string.concat("inv-staker", string(abi.encodePacked(bytes1(uint8(48 + i)))))));
            actors.push(stakers[i]);
        }
        actors.push(makeAddr("inv-caller"));
        actors.push(makeAddr("inv-reporter"));
        actors.push(treasury_);
        actors.push(developer_);
        actors.push(makeAddr("inv-caller2"));
        for (uint256 i; i < 3; ++i) {
            referees.push(makeAddr(string.concat("inv-referee", string(abi.encodePacked(bytes1(uint8(48 + i)))))));
            actors.push(referees[i]);
        }
        usd = new TestUSD();
        dec2 = new DecimalsToken(2);
        tokens.push(address(usd));
        tokens.push(address(dec2));
        gateway = makeAddr("inv-gateway");
        for (uint256 i; i < tokens.length; ++i) {
            vm.prank(developer_);
            bsm_.setPaymentToken(tokens[i], true);
        }
        verifier = new SignedAttestationVerifier(address(this), vm.addr(_ATTESTER_KEY));
        vm.prank(developer_);
        bsm_.setAttestationVerifier(address(verifier), true);
    }

    /// Credit of `a` in the unit `token` (address(0): ether).
    function transcriptOf(address a) internal pure returns (bytes32) {
        return keccak256(abi.encode("transcript", a));
    }

    function _cr(address token, address a) internal view returns (uint256) {
        return token == address(0) ? bsm.creditOf(a) : bsm.tokenCreditOf(token, a);
    }

    function _escrowIn(address token) internal view returns (uint256 e) {
        if (token == address(0)) (,, e,,) = bsm.accounting();
        else (e,,) = bsm.tokenAccounting(token);
    }

    function _op(uint256 s) internal view returns (address) {
        return operators[s % operators.length];
    }

    function _actor(uint256 s) internal view returns (address) {
        return actors[s % actors.length];
    }

    function _job(uint256 s) internal view returns (uint256) {
        return jobs.length == 0 ? 0 : jobs[s % jobs.length];
    }

    function _fund(address a, uint256 amount) internal {
        vm.deal(a, a.balance + amount);
        ghostIn += amount;
    }

    // ------------------------------------------------------------ staking

    function register(uint256 s, uint256 amount) external {
        address a = _op(s);
        if (bsm.getOperator(a).registered) return;
        amount = bound(amount, 1 ether, 20 ether);
        string[] memory m = new string[](1);
        m[0] = "/ip4/127.0.0.1/tcp/4001";
        _fund(a, amount);
        vm.prank(a);
        bsm.registerOperator{value: amount}(bytes32(uint256(uint160(a))), m, "cpu", 0);
    }

    function stake(uint256 s, uint256 amount) external {
        address a = _op(s);
        if (!bsm.getOperator(a).registered) return;
        amount = bound(amount, 1, 5 ether);
        _fund(a, amount);
        vm.prank(a);
        bsm.stake{value: amount}();
    }

    function unstake(uint256 s, uint256 amount) external {
        address a = _op(s);
        if (!bsm.getOperator(a).registered) return;
        uint256 have = bsm.stakeOf(a, a);
        uint256 keep = bsm.bondedOf(a) > 1 ether ? bsm.bondedOf(a) : 1 ether;
        if (have <= keep) return;
        amount = bound(amount, 1, have - keep);
        vm.prank(a);
        bsm.unstake(amount);
    }

    function deregister(uint256 s) external {
        address a = _op(s);
        I.OperatorInfo memory o = bsm.getOperator(a);
        if (!o.registered || o.activeJobs > 0) return;
        vm.prank(a);
        bsm.deregisterOperator();
    }

    function delegate(uint256 s, uint256 o, uint256 amount) external {
        address a = _op(o);
        if (!bsm.getOperator(a).registered) return;
        address st = stakers[s % stakers.length];
        amount = bound(amount, 1, 10 ether);
        _fund(st, amount);
        vm.prank(st);
        bsm.delegate{value: amount}(a);
    }

    function undelegate(uint256 s, uint256 o, uint256 amount) external {
        address a = _op(o);
        address st = stakers[s % stakers.length];
        uint256 have = bsm.stakeOf(a, st);
        if (have == 0) return;
        amount = bound(amount, 1, have);
        vm.prank(st);
        bsm.undelegate(a, amount);
    }

    function withdrawUnbonded(uint256 s, uint256 o) external {
        address a = _op(o);
        address who = _actor(s);
        (uint256 amount, uint64 unlockAt) = bsm.unbondingOf(a, who);
        if (amount == 0 && unlockAt == 0) return;
        if (block.timestamp < unlockAt) vm.warp(unlockAt);
        vm.prank(who);
        bsm.withdrawUnbonded(a);
    }

    function claim(uint256 s, uint256 o) external {
        vm.prank(_actor(s));
        bsm.claimRewards(_op(o));
    }

    function withdraw(uint256 s) external {
        address who = _actor(s);
        uint256 credit = bsm.creditOf(who);
        if (credit == 0) return;
        vm.prank(who);
        bsm.withdraw();
        ghostOut += credit;
    }

    function withdrawToken(uint256 s) external {
        address who = _actor(s);
        address token = tokens[(s >> 128) % tokens.length];
        uint256 credit = bsm.tokenCreditOf(token, who);
        if (credit == 0) return;
        uint256 before = IMintable(token).balanceOf(who);
        vm.prank(who);
        bsm.withdrawToken(token);
        if (IMintable(token).balanceOf(who) - before != credit) ++ghostWhoViolations;
        ghostTokenOut[token] += credit;
    }

    function coreSlash(uint256 o, uint256 pct) external {
        pct = bound(pct, 1, 50);
        vm.prank(core);
        bsm.onSlash(0, abi.encode(_op(o)), uint8(pct));
    }

    function warp(uint256 dt) external {
        vm.warp(block.timestamp + bound(dt, 1, 2 hours));
    }

    // ------------------------------------------------------------ jobs

    /// Two callers; specs differ in rounds per epoch (sync thresholds) and epoch length, with
    /// the shortest epoch the protocol allows among them.
    function createJob(uint256 minOps, uint256 maxOps, uint256 epochs, uint256 price) external {
        maxOps = bound(maxOps, 2, 4);
        minOps = bound(minOps, 2, maxOps);
        bool short = (price >> 128) & 1 == 1;
        I.JobSpec memory s = I.JobSpec({
            modelHash: keccak256("m"),
            modelUri: "",
            datasetHash: keccak256("d"),
            datasetUri: "",
            method: I.Method.SFT,
            totalEpochs: uint32(bound(epochs, 1, 3)),
            stepsPerEpoch: (price >> 129) & 1 == 1 ? 80 : 8,
            syncInterval: 2,
            topkPerChunk: 4,
            quantBits: 1,
            minOperators: uint8(minOps),
            maxOperators: uint8(maxOps),
            epochDuration: short ? uint64(bsm.params().minEpochDuration) : 1 hours,
            teeRequired: (price >> 134) & 7 == 1,
            pricePerOperatorEpoch: bound(price, 1, 1 ether),
            seatBond: bsm.params().minSeatBond * (1 + ((price >> 131) & 1)),
            recipeHash: bytes32(0),
            recipeUri: ""
        });
        uint256 escrow = s.pricePerOperatorEpoch * s.maxOperators * s.totalEpochs;
        address c = (price >> 130) & 1 == 1 ? actors[11] : actors[7];
        // A job's juries are drawn from the operators registered when it was created.
        if (bsm.params().challengeWindow != 0) _registerReferees();
        if ((price >> 132) & 1 == 1) {
            // Paid in a token by a gateway; the caller owns the job.
            address token = tokens[(price >> 133) & 1];
            IMintable(token).mint(gateway, escrow);
            ghostTokenIn[token] += escrow;
            vm.startPrank(gateway);
            IMintable(token).approve(address(bsm), escrow);
            jobs.push(bsm.createJobWithToken(s, token, c));
            vm.stopPrank();
            ++ghostTokenJobs;
            ++ghostJobsIn[token];
        } else {
            _fund(c, escrow);
            vm.prank(c);
            jobs.push(bsm.createJob{value: escrow}(s));
        }
        if (short) ++ghostShortEpochJobs;
        if (s.teeRequired) ++ghostTeeJobs;
    }

    /// Operator `o` attests (a TEE statement signed by the service, valid for `validity`).
    function attest(uint256 o, uint256 validity) external {
        address a = _op(o);
        if (!bsm.getOperator(a).registered) return;
        V.Statement memory st = V.Statement({
            operator: a,
            peerKey: bsm.getOperator(a).peerKey,
            teeType: 1,
            measurement: keccak256("mrtd"),
            reportDataHash: keccak256("report"),
            issuedAt: uint64(block.timestamp),
            expiresAt: uint64(block.timestamp + bound(validity, 1 hours, 3 days))
        });
        (uint8 v, bytes32 r, bytes32 sig) = vm.sign(_ATTESTER_KEY, verifier.statementDigest(st));
        vm.prank(a);
        bsm.submitAttestation(address(verifier), abi.encode(st, abi.encodePacked(r, sig, v)));
    }

    function _ensureOperators(uint256 n) internal {
        for (uint256 i; i < n; ++i) {
            address a = operators[i];
            if (!bsm.getOperator(a).registered) {
                _fund(a, 2 ether);
                string[] memory m = new string[](1);
                m[0] = "/ip4/127.0.0.1/tcp/4001";
                vm.prank(a);
                bsm.registerOperator{value: 2 ether}(bytes32(uint256(uint160(a))), m, "cpu", 0);
            }
            // Room for one more seat of the largest bond a job asks.
            uint256 need = bsm.bondedOf(a) + 2 * bsm.params().minSeatBond;
            uint256 have = bsm.stakeOf(a, a);
            if (have < need || have < 1 ether) {
                uint256 add = (need > 1 ether ? need : 1 ether) - have;
                _fund(a, add);
                vm.prank(a);
                bsm.stake{value: add}();
            }
        }
    }

    /// A whole job in one step (reach): `n` operators train `epochs` epochs and agree, or
    /// (`fail`) disagree until the job fails and the caller is refunded.
    function wholeJob(uint256 n, uint256 epochs, bool fail, uint256 r) external {
        n = bound(n, 2, 3);
        _ensureOperators(n + 1);
        uint256 price = 0.01 ether;
        bool late = (r >> 30) & 1 == 1; // a seat left for an operator joining mid-epoch
        this.createJob(n, late ? n + 1 : n, epochs, price | (r & ((55 << 128) | (7 << 134))));
        uint256 id = jobs[jobs.length - 1];
        (I.JobSpec memory spec,) = bsm.getJob(id);
        for (uint256 i; spec.teeRequired && i <= n; ++i) {
            this.attest(i, 3 days);
        }
        for (uint256 i; i < n; ++i) {
            (, I.JobState memory st0) = bsm.getJob(id);
            if (st0.status != I.JobStatus.Open) break;
            try this.joinAs(operators[i], id) {} catch {}
        }
        // Half of the jobs get one applicant more than they have seats, when seats are drawn.
        if ((r >> 36) & 1 == 1 && bsm.params().seatDrawWindow > 0 && n + 2 <= operators.length) {
            _ensureOperators(n + 2);
            try this.joinAs(operators[n + 1], id) {} catch {}
        }
        this.drawSeats(id, r, true);
        for (uint256 k; k < 12; ++k) {
            (, I.JobState memory st) = bsm.getJob(id);
            if (st.status != I.JobStatus.Running) break;
            // Agreeing votes; to fail, the members vote three different checkpoints.
            uint256 mode = (fail ? (uint256(1) << 17) | (uint256(1) << 18) : 0) | (r & (uint256(1) << 24));
            // Half of the 3-member jobs that agree have member 2 dissent, under the quorum.
            if (!fail && n == 3 && (r >> 40) & 1 == 1) mode |= uint256(1) << 18;
            // A quarter of the jobs are voted unworkable by everyone (aborted, nobody slashed).
            if ((r >> 25) & 3 == 3) mode |= uint256(1) << 25;
            // An eighth of them have member 1 commit and never reveal in epoch k == 0.
            if (k == 0 && (r >> 27) & 7 == 7) mode |= uint256(1) << 21;
            if (k == 0 && late) _queueJoin(id, operators[n]);
            // With draws, half of those without an extra applicant get a second one queued
            // for the one free seat.
            if (k == 0 && late && (r >> 36) & 3 == 2 && bsm.params().seatDrawWindow > 0 && n + 2 <= operators.length) {
                _ensureOperators(n + 2);
                _queueJoin(id, operators[n + 1]);
            }
            this.submit(id, mode, true);
            // An eighth of the epochs are challenged (on a deployment with a window).
            if ((r >> 32) & 7 == 7) this.challenge(id, r >> (k + 3), true);
            // A quarter of the jobs are cancelled by their caller once epoch 0's votes are in.
            if (k == 0 && (r >> 38) & 3 == 3) this.cancelRunning(id, true);
            this.finalize(id, r + k, true);
        }
    }

    /// `a` joins while the epoch runs: a pending join, seated at the boundary.
    function _queueJoin(uint256 id, address a) internal {
        uint256 before = bsm.getPendingJoins(id).length;
        try this.joinAs(a, id) {} catch {}
        if (bsm.getPendingJoins(id).length > before) ++ghostQueuedJoins;
    }

    function joinAs(address a, uint256 id) external {
        _joinJob(a, id);
    }

    /// Every join: one into a job that requires a TEE is counted, and must have been made
    /// with a valid attestation.
    function _joinJob(address a, uint256 id) internal {
        (I.JobSpec memory s,) = bsm.getJob(id);
        (,,,,,, bool attested) = bsm.attestationOf(a);
        vm.prank(a);
        bsm.joinJob(id);
        if (s.teeRequired) {
            ++ghostTeeJoins;
            if (!attested) ++ghostTeeJoinViolations;
        }
    }

    function drawSeats(uint256 j, uint256 r) external {
        this.drawSeats(_job(j), r, true);
    }

    /// Draws the seats of an `Open` job whose draw is scheduled (waiting until it is due): the
    /// job must start with min(applicants, maxOperators) of its applicants, and every applicant
    /// left out must get its seat bond back.
    function drawSeats(uint256 id, uint256 r, bool) external {
        if (id == 0) return;
        (I.JobSpec memory s, I.JobState memory st) = bsm.getJob(id);
        uint256 at = bsm.seatDrawAt(id);
        if (st.status != I.JobStatus.Open || at == 0) return;
        if (block.timestamp < at) vm.warp(at);
        address[] memory a = bsm.getMembers(id);
        uint256[] memory bonded = new uint256[](a.length);
        for (uint256 i; i < a.length; ++i) {
            bonded[i] = bsm.bondedOf(a[i]);
        }
        bsm.drawSeats(id); // sealed: the next block's hash draws
        vm.roll(block.number + 2);
        vm.setBlockhash(block.number - 1, keccak256(abi.encode(r)));
        bsm.drawSeats(id);
        ++ghostSeatDraws;
        uint256 want = a.length < s.maxOperators ? a.length : s.maxOperators;
        (, st) = bsm.getJob(id);
        if (bsm.getMembers(id).length != want || st.status != I.JobStatus.Running) ++ghostSeatViolations;
        address[] memory m = bsm.getMembers(id);
        uint256 left;
        for (uint256 i; i < a.length; ++i) {
            bool seated;
            for (uint256 k; k < m.length; ++k) {
                seated = seated || m[k] == a[i];
            }
            if (!seated) ++left;
            if (bsm.bondedOf(a[i]) != (seated ? bonded[i] : bonded[i] - s.seatBond)) ++ghostSeatViolations;
        }
        if (left != a.length - want) ++ghostSeatViolations;
        ghostSeatsNotDrawn += left;
    }

    function cancel(uint256 j) external {
        uint256 id = _job(j);
        if (id == 0) return;
        (, I.JobState memory st) = bsm.getJob(id);
        if (st.status != I.JobStatus.Open) return;
        vm.prank(st.caller);
        bsm.cancelJob(id);
    }

    /// The caller cancels a running job: it stays Running until its epoch is finalized.
    function cancelRunning(uint256 j) external {
        this.cancelRunning(_job(j), true);
    }

    function cancelRunning(uint256 id, bool) external {
        if (id == 0) return;
        (, I.JobState memory st) = bsm.getJob(id);
        if (st.status != I.JobStatus.Running || bsm.cancelRequested(id)) return;
        vm.prank(st.caller);
        bsm.cancelJob(id);
        (, I.JobState memory after_) = bsm.getJob(id);
        if (after_.status != I.JobStatus.Running || after_.escrow != st.escrow) ++ghostWhoViolations;
        ++ghostCancelRequests;
    }

    /// A job whose caller cancelled it while running ends at the boundary its epoch reached:
    /// completed if that was its last epoch, else Cancelled with its whole remaining escrow
    /// gone (`left`: what left the escrow books: payments, compensations and the refund, which
    /// `_checkWho` checks the caller received), so the refund is the unearned escrow exactly.
    function _checkCancelled(uint256 left) internal {
        (, I.JobState memory st) = bsm.getJob(_jobId);
        if (st.status == I.JobStatus.Running || st.status == I.JobStatus.Open) {
            ++ghostSettlementViolations; // a cancelled job started another epoch
        } else if (st.status == I.JobStatus.Cancelled) {
            if (st.escrow != 0 || left != _jobEscrow) ++ghostSettlementViolations;
            ++ghostCancelledRunning;
        }
    }

    /// A stranger fails a job that started and then waited `openTimeout` for members: the
    /// caller gets the whole remaining escrow, nobody else anything.
    function expire(uint256 j, uint256 r) external {
        uint256 id = _job(j);
        if (id == 0) return;
        (, I.JobState memory st) = bsm.getJob(id);
        if (st.status != I.JobStatus.Open || st.attempt == 0) return;
        uint256 at = uint256(st.epochStart) + bsm.params().openTimeout;
        if (block.timestamp <= at) vm.warp(at + 1);
        address stranger = actors[r % 9];
        address token = bsm.jobToken(id);
        uint256 c0 = _cr(token, st.caller);
        uint256 s0 = _cr(token, stranger);
        uint256 e0 = _escrowIn(token);
        vm.prank(stranger);
        bsm.cancelJob(id);
        uint256 e1 = _escrowIn(token);
        if (_cr(token, st.caller) - c0 != st.escrow || e0 - e1 != st.escrow) ++ghostWhoViolations;
        if (stranger != st.caller && _cr(token, stranger) != s0) ++ghostWhoViolations;
        ghostRefundedTo[st.caller] += st.escrow;
        ++ghostExpiredJobs;
    }

    function join(uint256 o, uint256 j) external {
        uint256 id = _job(j);
        if (id == 0) return;
        _joinJob(_op(o), id);
    }

    function leave(uint256 o, uint256 j) external {
        uint256 id = _job(j);
        if (id == 0) return;
        vm.prank(_op(o));
        bsm.leaveJob(id);
    }

    /// Members mostly agree on one hash; `mode` picks forged hashes, low participation,
    /// UNWORKABLE votes (bit 25: everyone, bits 26+i: member i) and withheld reveals (bits 20+i).
    /// Commitments are revealed as soon as everyone committed, else at finalize.
    function submit(uint256 j, uint256 mode) external {
        this.submit(_job(j), mode, true);
    }

    function submit(uint256 id, uint256 mode, bool) external {
        if (id == 0) return;
        (, I.JobState memory st) = bsm.getJob(id);
        if (st.status != I.JobStatus.Running || block.timestamp > bsm.epochDeadline(id)) return;
        address[] memory m = bsm.getMembers(id);
        uint32[] memory p = new uint32[](m.length);
        for (uint256 i; i < m.length; ++i) {
            p[i] = (mode >> (8 + i)) & 1 == 1 ? 0 : 4;
        }
        for (uint256 i; i < m.length; ++i) {
            if ((mode >> i) & 3 == 3) continue; // silent
            (bytes32 c,,) = bsm.submissionOf(id, m[i]);
            if (c != bytes32(0)) continue;
            _commit(id, st, m[i], _voteOf(id, st.epoch, i, mode), p, (mode >> (20 + i)) & 1 == 1);
        }
        (uint256 committed,) = bsm.voteCounts(id);
        if (committed == m.length) _revealAll(id);
    }

    function _commit(uint256 id, I.JobState memory st, address a, bytes32 ckpt, uint32[] memory p, bool withhold)
        internal
    {
        Hidden storage hd = _hidden[id][st.attempt][a];
        (hd.h, hd.p, hd.withhold) = (ckpt, p, withhold);
        if (withhold) ++ghostWithheldReveals;
        bytes32 c =
            bsm.commitmentHash(id, st.epoch, a, ckpt, p, transcriptOf(a), keccak256(abi.encode(id, st.attempt, a)));
        vm.prank(a);
        bsm.commitCheckpoint(id, st.epoch, c);
    }

    function _voteOf(uint256 id, uint256 epoch, uint256 i, uint256 mode) internal returns (bytes32) {
        if ((mode >> 25) & 1 == 1 || (mode >> (26 + i)) & 1 == 1) return _UNWORKABLE;
        if ((mode >> (16 + i)) & 1 == 1) return keccak256(abi.encode("forged", i));
        // Mode bit 24: every job votes the same checkpoint, so equal votes meet across jobs.
        if ((mode >> 24) & 1 == 1) {
            ++ghostCrossJobVotes;
            return keccak256("shared");
        }
        return keccak256(abi.encode(id, epoch));
    }

    /// Reveals every unrevealed commitment that is not withheld (once reveals are open).
    function _revealAll(uint256 id) internal {
        (, I.JobState memory st) = bsm.getJob(id);
        if (st.status != I.JobStatus.Running || block.timestamp > bsm.revealDeadline(id)) return;
        address[] memory m = bsm.getMembers(id);
        (uint256 committed,) = bsm.voteCounts(id);
        if (committed < m.length && block.timestamp <= bsm.epochDeadline(id)) vm.warp(bsm.epochDeadline(id) + 1);
        for (uint256 i; i < m.length; ++i) {
            (bytes32 c,, bytes32 key) = bsm.submissionOf(id, m[i]);
            if (c == bytes32(0) || key != bytes32(0)) continue;
            Hidden storage hd = _hidden[id][st.attempt][m[i]];
            if (hd.withhold) continue;
            vm.prank(m[i]);
            bsm.revealCheckpoint(
                id, st.epoch, hd.h, hd.p, transcriptOf(m[i]), keccak256(abi.encode(id, st.attempt, m[i]))
            );
        }
    }

    // ------------------------------------------------------------ challenges

    function challenge(uint256 j, uint256 r) external {
        this.challenge(_job(j), r, true);
    }

    /// Disputes the certified vote of the job's attempt (as its caller or a member) and plays the
    /// whole game: the outside referees apply and commit-reveal the honest vote (with `r` bit 4
    /// one of them reveals a forged one, bit 5 one stays silent), then anyone resolves. Checks
    /// that the bond went back to the challenger or to the treasury and every referee slash to the
    /// treasury.
    function challenge(uint256 id, uint256 r, bool) external {
        if (id == 0 || bsm.params().challengeWindow == 0) return;
        (, I.JobState memory st) = bsm.getJob(id);
        if (st.status != I.JobStatus.Running) return;
        _revealAll(id);
        address[] memory m = bsm.getMembers(id);
        (, uint256 revealed) = bsm.voteCounts(id);
        if (revealed < m.length && block.timestamp <= bsm.revealDeadline(id)) vm.warp(bsm.revealDeadline(id) + 1);
        (bytes32 key, uint256 closes) = bsm.certifiedVote(id);
        if (closes == 0 || block.timestamp >= closes) return; // no quorum is challenged too
        if (bsm.challengeOf(st.attempt).challenger != address(0)) return;
        uint256 who = (r >> 15) & 1 == 1 ? _dissenter(id, m, key, (r >> 1) % m.length) : (r >> 1) % m.length;
        address challenger = r & 1 == 1 && (r >> 15) & 1 == 0 ? st.caller : m[who];
        uint256 bond = bsm.params().challengeBond;
        _registerReferees();
        _fund(challenger, bond);
        vm.prank(challenger);
        bsm.challenge{value: bond}(id, st.epoch, bytes32(r));
        ++ghostChallenges;
        if (key == bytes32(0)) ++ghostUncertifiedChallenges;
        // bits 6..13 of `r`: the voters the referees find consistent with their own files; a
        // member challenger's own bit three times in four (bit 15: a dissenter challenges)
        uint256 bits = (r >> 6) & 0xff;
        if (challenger != st.caller && (r >> 14) & 3 != 0) bits |= 1 << who;
        // a quarter of the verdicts catch members by replay (bits 16..19 of `r`)
        if ((r >> 20) & 3 == 3) bits |= ((r >> 16) & 0xf) << 128;
        uint256 inRange = (1 << m.length) - 1;
        bits &= inRange | inRange << 128;
        _referee(id, st.epoch, r, bits);
        _resolve(id, st.epoch, challenger, key);
    }

    /// Registers the three outside referees (before a job is created: its draws read the
    /// registry as it stood then, and the weights no heavier than they were).
    function _registerReferees() internal {
        for (uint256 i; i < referees.length; ++i) {
            address a = referees[i];
            if (!bsm.getOperator(a).registered) {
                _fund(a, 3 ether);
                vm.prank(a);
                bsm.registerOperator{value: 3 ether}(bytes32(uint256(uint160(a))), new string[](0), "cpu", 0);
            }
        }
    }

    /// What the drawn referees will be paid: half the bond, shared by those that reveal the
    /// verdict (set by `_referee`).
    uint256 internal _expectedFee;

    function _referee(uint256 id, uint256 epoch, uint256 r, uint256 bits) internal {
        vm.roll(block.number + 2);
        bsm.drawReferees(id, epoch);
        address[] memory refs = bsm.challengeOf(_attemptOf(id)).referees;
        vm.warp(block.timestamp + bsm.params().challengeWindow);
        uint32[] memory p = new uint32[](bsm.getMembers(id).length);
        for (uint256 i; i < p.length; ++i) {
            p[i] = 4;
        }
        bool forged = (r >> 4) & 1 == 1 && refs.length > 1;
        bool silent = (r >> 5) & 1 == 1 && refs.length > 2;
        for (uint256 i; i < refs.length; ++i) {
            if (i == 2 && silent) continue;
            bytes32 v = i == 1 && forged ? keccak256("forged verdict") : keccak256(abi.encode(id, epoch));
            bytes32 c = bsm.commitmentHash(id, epoch, refs[i], v, p, bytes32(bits), bytes32(i));
            vm.prank(refs[i]);
            bsm.commitVerdict(id, epoch, c);
        }
        if (silent) vm.warp(block.timestamp + bsm.params().challengeWindow);
        for (uint256 i; i < refs.length; ++i) {
            if (i == 2 && silent) continue;
            bytes32 v = i == 1 && forged ? keccak256("forged verdict") : keccak256(abi.encode(id, epoch));
            vm.prank(refs[i]);
            bsm.revealVerdict(id, epoch, v, p, bits, bytes32(i));
        }
        uint256 honest = refs.length - (forged ? 1 : 0) - (silent ? 1 : 0);
        bool verdict = honest * 2 > refs.length && refs.length >= uint256(bsm.params().refereeCount) / 2 + 1;
        _expectedFee = verdict ? bsm.params().challengeBond / 2 / honest * honest : 0;
        // resolvable once every referee revealed, else after the reveal phase
        if (silent || refs.length == 0) vm.warp(block.timestamp + bsm.params().challengeWindow);
    }

    function _resolve(uint256 id, uint256 epoch, address challenger, bytes32 certified) internal {
        uint256 t0 = bsm.creditOf(treasury);
        uint256 c0 = bsm.creditOf(challenger);
        vm.recordLogs();
        vm.prank(actors[8]); // a stranger
        bsm.resolveChallenge(id, epoch);
        (, uint256 slashed,) = _settledFromLogs(vm.getRecordedLogs());
        (bytes32 verdict, uint256 consistent, bool excused) = _judged(id, challenger);
        uint256 caught = bsm.challengeOf(_attemptOf(id)).caught;
        bool backToChallenger = verdict == bytes32(0) || verdict != certified || excused || caught != 0;
        _checkBond(challenger, t0, c0, slashed, verdict == bytes32(0), backToChallenger);
        ghostSlashed += slashed;
        if (slashed > 0) ++ghostRefereesSlashed;
        if (verdict != bytes32(0)) ++ghostVerdicts;
        if (verdict != bytes32(0) && verdict != certified) ++ghostOverturned;
        if (verdict != bytes32(0) && consistent != 0) ++ghostConsistentVerdicts;
        if (verdict != bytes32(0) && caught != 0) ++ghostCaughtVerdicts;
        if (_expectedFee > 0) ++ghostPaidVerdicts;
    }

    /// The bond less what the verdict's referees are paid (and less a quarter, to the
    /// treasury, without a verdict) went to the challenger or to the treasury; every referee
    /// slash to the treasury.
    function _checkBond(address challenger, uint256 t0, uint256 c0, uint256 slashed, bool noVerdict, bool back)
        internal
    {
        uint256 cost = noVerdict ? bsm.params().challengeBond / 4 : 0;
        uint256 kept = bsm.params().challengeBond - _expectedFee - cost;
        uint256 toTreasury = bsm.creditOf(treasury) - t0;
        if (challenger == treasury) toTreasury -= kept;
        else if (bsm.creditOf(challenger) - c0 != (back ? kept : 0)) ++ghostChallengeViolations;
        if (toTreasury != slashed + cost + (back ? 0 : kept)) ++ghostChallengeViolations;
    }

    function _attemptOf(uint256 id) internal view returns (uint64) {
        (, I.JobState memory st) = bsm.getJob(id);
        return st.attempt;
    }

    /// The verdict of job `id`'s challenge, its consistent voters, and whether `challenger` is a
    /// consistent voter of another vote (its bond comes back even when upheld).
    function _judged(uint256 id, address challenger)
        internal
        view
        returns (bytes32 verdict, uint256 consistent, bool excused)
    {
        (, I.JobState memory st) = bsm.getJob(id);
        I.ChallengeInfo memory ch = bsm.challengeOf(st.attempt);
        (verdict, consistent) = (ch.verdictKey, ch.consistent);
        (,, bytes32 voted) = bsm.submissionOf(id, challenger);
        excused = verdict != bytes32(0) && voted != verdict && _bitOf(id, challenger, consistent);
    }

    /// The first member that revealed a vote other than `key` (`otherwise` when none did).
    function _dissenter(uint256 id, address[] memory m, bytes32 key, uint256 otherwise)
        internal
        view
        returns (uint256)
    {
        for (uint256 i; i < m.length; ++i) {
            (,, bytes32 voted) = bsm.submissionOf(id, m[i]);
            if (voted != bytes32(0) && voted != key) return i;
        }
        return otherwise;
    }

    function _bitOf(uint256 id, address who, uint256 bits) internal view returns (bool) {
        address[] memory m = bsm.getMembers(id);
        for (uint256 i; i < m.length; ++i) {
            if (m[i] == who) return bits & (1 << i) != 0;
        }
        return false;
    }

    /// Ether stake held, and the job's unit (ether or its token): escrow, owed, developer's credit.
    struct Books {
        uint256 held; // staked + unbonding
        uint256 escrow;
        uint256 owed; // credits + pool rewards
        uint256 developer;
        uint256 etherOwed;
    }

    function _books(address token) internal view returns (Books memory b) {
        (uint256 s, uint256 u, uint256 e, uint256 c, uint256 r) = bsm.accounting();
        b = Books(s + u, e, c + r, bsm.creditOf(developer), c + r);
        if (token != address(0)) {
            (e, c, r) = bsm.tokenAccounting(token);
            (b.escrow, b.owed, b.developer) = (e, c + r, bsm.tokenCreditOf(token, developer));
        }
    }

    function finalize(uint256 j, uint256 r) external {
        this.finalize(_job(j), r, true);
    }

    struct Who {
        address token; // the job's unit; bounties and slashes are in ether
        address caller;
        address reporter;
        uint256 callerCredit;
        uint256 reporterCredit;
        address[] members;
        uint256[] memberCredit;
        uint256[] memberPool;
        bytes32[] memberVote;
        bool reporterPending;
    }

    function _who(uint256 id, address reporter) internal view returns (Who memory w) {
        (, I.JobState memory st) = bsm.getJob(id);
        w.token = bsm.jobToken(id);
        w.caller = st.caller;
        w.reporter = reporter;
        w.callerCredit = _cr(w.token, st.caller);
        w.reporterCredit = _cr(w.token, reporter);
        w.members = bsm.getMembers(id);
        address[] memory pending = bsm.getPendingJoins(id);
        for (uint256 i; i < pending.length; ++i) {
            if (pending[i] == reporter) w.reporterPending = true;
        }
        w.memberCredit = new uint256[](w.members.length);
        w.memberPool = new uint256[](w.members.length);
        w.memberVote = new bytes32[](w.members.length);
        for (uint256 i; i < w.members.length; ++i) {
            (,, w.memberVote[i]) = bsm.submissionOf(id, w.members[i]);
            w.memberCredit[i] = _cr(w.token, w.members[i]);
            I.PoolInfo memory p = bsm.getPool(w.members[i]);
            w.memberPool[i] = p.totalAssets + p.unbondingAssets;
        }
    }

    function finalize(uint256 id, uint256 r, bool) external {
        if (id == 0) return;
        (I.JobSpec memory spec, I.JobState memory st) = bsm.getJob(id);
        if (st.status != I.JobStatus.Running) return;
        _revealAll(id);
        (, uint256 revealed) = bsm.voteCounts(id);
        if (revealed < bsm.getMembers(id).length && block.timestamp <= bsm.revealDeadline(id)) {
            vm.warp(bsm.revealDeadline(id) + 1);
        }
        (, uint256 closes) = bsm.certifiedVote(id);
        if (bsm.challengeOf(st.attempt).challenger == address(0) && block.timestamp < closes) vm.warp(closes);
        // Half of the boundaries come once the vacancy draw's seed block is mined.
        if ((r >> 44) & 1 == 1) vm.roll(block.number + 2);
        // The finalizer may earn a share of the fee, so it is never the developer (checked
        // below). It may be the job's caller, a member, a staker or an outsider; a quarter of
        // the epochs are settled by the core's FINALIZE hook in pieces (as the treasury).
        Who memory w = _who(id, (r >> 40) & 3 == 3 ? treasury : actors[r % 9]);
        Books memory b0 = _books(w.token);
        (_cancelAsked, _jobEscrow, _jobId) = (bsm.cancelRequested(id), st.escrow, id);
        vm.recordLogs();
        if ((r >> 40) & 3 == 3) {
            _hookFinalize(id, st.epoch, st.attempt);
        } else {
            vm.prank(w.reporter);
            bsm.finalizeEpoch(id, st.epoch);
        }
        Vm.Log[] memory logs = vm.getRecordedLogs();
        _checkVacancies(id, logs);
        (uint256 paid, uint256 slashed, uint256 comp) = _settledFromLogs(logs);
        Books memory b1 = _books(w.token);
        (, st) = bsm.getJob(id);
        uint256 price = spec.pricePerOperatorEpoch;
        uint256 refund = b0.escrow - b1.escrow - paid * price - comp; // underflow: escrow fell short
        bool ended =
            st.status == I.JobStatus.Completed || st.status == I.JobStatus.Failed || st.status == I.JobStatus.Cancelled;
        if (!ended && refund != 0) ++ghostSettlementViolations;
        _checkOwed(w.token, b0, b1, paid * price + refund + comp, slashed);
        if (w.token != address(0)) ghostTokenPaidEpochs += paid;
        // The developer receives exactly its share of each paid operator-epoch.
        uint256 devCut = price * bsm.params().developerBps / 10000;
        if (b1.developer - b0.developer != paid * devCut) ++ghostSplitViolations;
        ghostPaidEpochs += paid;
        ghostSlashed += slashed;
        _checkWho(w, logs, price, refund);
        if (_cancelAsked) _checkCancelled(b0.escrow - b1.escrow);
        if (_aborted(logs)) {
            ++ghostAbortedJobs;
            // Nobody is slashed or paid when a quorum voted UNWORKABLE.
            if (slashed != 0 || paid != 0 || st.status != I.JobStatus.Failed) ++ghostWhoViolations;
        }
        if (st.status == I.JobStatus.Completed) ++ghostCompletedJobs;
        if (st.status == I.JobStatus.Failed && refund > 0) ++ghostFailedRefunds;
    }

    /// A vacancy draw fills every free seat and leaves the rest of the queue bonded.
    function _checkVacancies(uint256 id, Vm.Log[] memory logs) internal {
        (I.JobSpec memory spec,) = bsm.getJob(id);
        for (uint256 i; i < logs.length; ++i) {
            if (logs[i].emitter != address(bsm)) continue;
            if (logs[i].topics[0] == _VACANCY_WAITS) ++ghostVacancyDeferrals;
            if (logs[i].topics[0] != _SEATS_DRAWN) continue;
            ++ghostVacancyDraws;
            if (bsm.getMembers(id).length != spec.maxOperators) ++ghostSeatViolations;
            address[] memory q = bsm.getPendingJoins(id);
            for (uint256 k; k < q.length; ++k) {
                if (bsm.bondedOf(q[k]) == 0) ++ghostSeatViolations;
            }
        }
    }

    /// The core calls FINALIZE until the epoch's attempt is settled (a few members a call).
    function _hookFinalize(uint256 id, uint256 epoch, uint64 attempt) internal {
        for (uint256 calls_; calls_ < 2 * 32; ++calls_) {
            vm.prank(core);
            bsm.onJobCall(0, 5, 0, abi.encode(id, epoch));
            (, I.JobState memory st) = bsm.getJob(id);
            if (st.status != I.JobStatus.Running || st.epoch != epoch || st.attempt != attempt) {
                ++ghostHookSettlements;
                return;
            }
        }
        ++ghostSettlementViolations; // never settled
    }

    /// Everything that left escrow and stake arrived as credits or pool rewards, each in its
    /// unit: the job's (ether or its token) for the escrow `fromEscrow`, ether for slashed stake.
    function _checkOwed(address token, Books memory b0, Books memory b1, uint256 fromEscrow, uint256 slashed) internal {
        if (token == address(0)) {
            if (b1.owed - b0.owed != fromEscrow + slashed) ++ghostSettlementViolations;
        } else {
            if (b1.owed - b0.owed != fromEscrow) ++ghostSettlementViolations;
            if (b1.etherOwed - b0.etherOwed != slashed) ++ghostSettlementViolations;
        }
        if (b0.held - b1.held != slashed) ++ghostSettlementViolations;
    }

    /// Each member got exactly its 40% if paid and nothing else (no bounty); a slashed member's
    /// pool lost exactly its logged slash and an unslashed one nothing; the caller got only the
    /// refund; an outside finalizer `reporterBountyBps` of the protocol's share of the paid
    /// operator-epochs (at most `maxReporterBounty`), whatever was slashed, and nothing if it is
    /// caller or member.
    function _checkWho(Who memory w, Vm.Log[] memory logs, uint256 price, uint256 refund) internal {
        uint256 opCut = price * bsm.params().operatorBps / 10000;
        uint256 comp = _aborted(logs) ? price * bsm.params().unworkableCompBps / 10000 : 0;
        bool reporterInside = w.reporter == w.caller || w.reporterPending;
        for (uint256 i; i < w.members.length; ++i) {
            address m = w.members[i];
            if (m == w.reporter) reporterInside = true;
            (bool paidM, uint256 slashedM) = _forMember(logs, m);
            uint256 due = (paidM ? opCut : 0) + (w.memberVote[i] == _UNWORKABLE ? comp : 0);
            if (_cr(w.token, m) - w.memberCredit[i] != due + (m == w.caller ? refund : 0)) ++ghostWhoViolations;
            I.PoolInfo memory p = bsm.getPool(m);
            if (w.memberPool[i] - (p.totalAssets + p.unbondingAssets) != slashedM) ++ghostWhoViolations;
            if (paidM) ghostPaidTo[m] += opCut;
            ghostSlashedFrom[m] += slashedM;
        }
        uint256 dCaller = _cr(w.token, w.caller) - w.callerCredit;
        bool callerIsMember;
        for (uint256 i; i < w.members.length; ++i) {
            if (w.members[i] == w.caller) callerIsMember = true;
        }
        if (!callerIsMember && dCaller != refund) ++ghostWhoViolations;
        ghostRefundedTo[w.caller] += refund;
        if (w.reporter != w.caller && w.reporter != treasury) {
            uint256 dr = _cr(w.token, w.reporter) - w.reporterCredit;
            if (!reporterInside) {
                if (dr != _bounty(price, comp > 0 ? 0 : _paidCount(logs))) ++ghostWhoViolations;
                ghostBountyTo[w.reporter] += dr;
            }
        }
    }

    /// An outside finalizer's reward for `paid` operator-epochs at `price`.
    function _bounty(uint256 price, uint256 paid) internal view returns (uint256) {
        I.Params memory q = bsm.params();
        uint256 protocol =
            price - price * q.operatorBps / 10000 - price * q.stakerBps / 10000 - price * q.developerBps / 10000;
        uint256 want = protocol * paid * q.reporterBountyBps / 10000;
        return want < q.maxReporterBounty ? want : q.maxReporterBounty;
    }

    function _paidCount(Vm.Log[] memory logs) internal view returns (uint256 n) {
        for (uint256 i; i < logs.length; ++i) {
            if (logs[i].emitter == address(bsm) && logs[i].topics[0] == _PAID) ++n;
        }
    }

    function _forMember(Vm.Log[] memory logs, address m) internal view returns (bool paid, uint256 slashed) {
        for (uint256 i; i < logs.length; ++i) {
            if (logs[i].emitter != address(bsm) || logs[i].topics.length < 2) continue;
            if (logs[i].topics[0] == _PAID && address(uint160(uint256(logs[i].topics[3]))) == m) paid = true;
            if (logs[i].topics[0] == _SLASHED && address(uint160(uint256(logs[i].topics[1]))) == m) {
                (,, uint256 amount,) = abi.decode(logs[i].data, (uint256, uint8, uint256, address));
                slashed += amount;
            }
        }
    }

    function _aborted(Vm.Log[] memory logs) internal view returns (bool) {
        for (uint256 i; i < logs.length; ++i) {
            if (logs[i].emitter == address(bsm) && logs[i].topics[0] == _ABORTED) return true;
        }
        return false;
    }

    function _settledFromLogs(Vm.Log[] memory logs)
        internal
        view
        returns (uint256 paid, uint256 slashed, uint256 comp)
    {
        for (uint256 i; i < logs.length; ++i) {
            if (logs[i].emitter != address(bsm)) continue;
            if (logs[i].topics[0] == _PAID) ++paid;
            if (logs[i].topics[0] == _ABORTED) {
                (uint256 n, uint256 each,) = abi.decode(logs[i].data, (uint256, uint256, uint256));
                comp += n * each;
            }
            if (logs[i].topics[0] == _SLASHED) {
                (,, uint256 amount,) = abi.decode(logs[i].data, (uint256, uint8, uint256, address));
                slashed += amount;
            }
        }
    }

    function tokenCount() external view returns (uint256) {
        return tokens.length;
    }

    function actorCount() external view returns (uint256) {
        return actors.length;
    }
}
