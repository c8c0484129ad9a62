// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";
import {IAttestationVerifier} from "../../src/interfaces/IAttestationVerifier.sol";
import {ISignedAttestationVerifier as V} from "../../src/interfaces/ISignedAttestationVerifier.sol";
import {SignedAttestationVerifier} from "../../src/SignedAttestationVerifier.sol";

/// A stranger's "verifier" that vouches for anyone, forever.
contract YesVerifier is IAttestationVerifier {
    function verify(address, bytes32, bytes calldata) external view returns (uint64, uint64, uint8, bytes32) {
        return (uint64(block.timestamp), type(uint64).max, 1, bytes32(0));
    }

    function validSince() external pure returns (uint64) {
        return 0;
    }
}

/// A verifier that returns an attestation that has already expired (the BSM must not trust it).
contract StaleVerifier is IAttestationVerifier {
    function verify(address, bytes32, bytes calldata) external view returns (uint64, uint64, uint8, bytes32) {
        return (uint64(block.timestamp - 10), uint64(block.timestamp), 1, bytes32(0));
    }

    function validSince() external pure returns (uint64) {
        return 0;
    }
}

abstract contract AttestationBase is BaseTest {
    uint256 internal constant SERVICE_KEY = 0xA77E57;
    uint256 internal constant OTHER_KEY = 0xBAD;
    bytes32 internal constant MEASUREMENT = keccak256("mrtd");
    uint64 internal constant VALIDITY = 1 days;

    address internal owner = makeAddr("verifierOwner");
    address internal stranger = makeAddr("stranger");
    SignedAttestationVerifier internal verifier;

    function setUp() public virtual override {
        super.setUp();
        vm.warp(1_000_000);
        verifier = new SignedAttestationVerifier(owner, vm.addr(SERVICE_KEY));
        vm.prank(developer);
        bsm.setAttestationVerifier(address(verifier), true);
    }

    function statement(address a) internal view returns (V.Statement memory s) {
        s = V.Statement({
            operator: a,
            peerKey: bsm.getOperator(a).peerKey,
            teeType: 1,
            measurement: MEASUREMENT,
            reportDataHash: keccak256("report data"),
            issuedAt: uint64(block.timestamp),
            expiresAt: uint64(block.timestamp) + VALIDITY
        });
    }

    function signed(V.Statement memory s, uint256 key) internal view returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 sig) = vm.sign(key, verifier.statementDigest(s));
        return abi.encode(s, abi.encodePacked(r, sig, v));
    }

    function attest(address a) internal {
        bytes memory ev = signed(statement(a), SERVICE_KEY);
        vm.prank(a);
        bsm.submitAttestation(address(verifier), ev);
    }

    function valid(address a) internal view returns (bool ok) {
        (,,,,,, ok) = bsm.attestationOf(a);
    }

    function teeJob() internal returns (uint256) {
        I.JobSpec memory s = spec(2, 2, 2);
        s.teeRequired = true;
        return createJob(s);
    }
}

/// SignedAttestationVerifier.verify: what it accepts and every way a statement fails.
contract VerifyTest is AttestationBase {
    address internal a;

    function setUp() public override {
        super.setUp();
        a = op(1);
        register(a, MIN_STAKE);
    }

    function test_accepts_a_statement_by_the_service_key() public view {
        V.Statement memory s = statement(a);
        (uint64 issuedAt, uint64 expiresAt, uint8 teeType, bytes32 m) =
            verifier.verify(a, s.peerKey, signed(s, SERVICE_KEY));
        vm.assertEq(issuedAt, s.issuedAt);
        vm.assertEq(expiresAt, s.expiresAt);
        vm.assertEq(teeType, 1);
        vm.assertEq(m, MEASUREMENT);
    }

    function test_revert_WrongSigner() public {
        V.Statement memory s = statement(a);
        bytes memory ev = signed(s, OTHER_KEY);
        vm.expectRevert(abi.encodeWithSelector(V.WrongSigner.selector, vm.addr(OTHER_KEY), vm.addr(SERVICE_KEY)));
        verifier.verify(a, s.peerKey, ev);
    }

    function test_revert_WrongSigner_tampered() public {
        V.Statement memory s = statement(a);
        bytes memory ev = signed(s, SERVICE_KEY);
        (, bytes memory sig) = abi.decode(ev, (V.Statement, bytes));
        s.measurement = keccak256("another image"); // signed for one measurement, claims another
        vm.expectRevert(); // recovers some other address
        verifier.verify(a, s.peerKey, abi.encode(s, sig));
    }

    function test_revert_StatementExpired() public {
        V.Statement memory s = statement(a);
        bytes memory ev = signed(s, SERVICE_KEY);
        vm.warp(s.expiresAt);
        vm.expectRevert(abi.encodeWithSelector(V.StatementExpired.selector, s.expiresAt, s.expiresAt));
        verifier.verify(a, s.peerKey, ev);
    }

    function test_revert_StatementNotYetValid() public {
        V.Statement memory s = statement(a);
        s.issuedAt += 60;
        bytes memory ev = signed(s, SERVICE_KEY);
        vm.expectRevert(abi.encodeWithSelector(V.StatementNotYetValid.selector, s.issuedAt, block.timestamp));
        verifier.verify(a, s.peerKey, ev);
    }

    function test_revert_WrongOperator() public {
        address b = op(2);
        register(b, MIN_STAKE);
        V.Statement memory s = statement(a);
        bytes memory ev = signed(s, SERVICE_KEY);
        vm.expectRevert(abi.encodeWithSelector(V.WrongOperator.selector, a, b));
        verifier.verify(b, s.peerKey, ev);
    }

    function test_revert_WrongPeerKey() public {
        V.Statement memory s = statement(a);
        bytes32 other = keccak256("other peer");
        bytes memory ev = signed(s, SERVICE_KEY);
        vm.expectRevert(abi.encodeWithSelector(V.WrongPeerKey.selector, s.peerKey, other));
        verifier.verify(a, other, ev);
    }

    function test_revert_UnknownTeeType() public {
        V.Statement memory s = statement(a);
        s.teeType = 3;
        bytes memory ev = signed(s, SERVICE_KEY);
        vm.expectRevert(abi.encodeWithSelector(V.UnknownTeeType.selector, 3));
        verifier.verify(a, s.peerKey, ev);
    }

    function test_revert_EmptyValidity() public {
        V.Statement memory s = statement(a);
        s.expiresAt = s.issuedAt;
        bytes memory ev = signed(s, SERVICE_KEY);
        vm.expectRevert(abi.encodeWithSelector(V.EmptyValidity.selector, s.issuedAt, s.expiresAt));
        verifier.verify(a, s.peerKey, ev);
    }

    function test_revert_MeasurementNotAllowed() public {
        vm.prank(owner);
        verifier.setMeasurement(keccak256("pinned image"), true);
        V.Statement memory s = statement(a);
        bytes memory ev = signed(s, SERVICE_KEY);
        vm.expectRevert(abi.encodeWithSelector(V.MeasurementNotAllowed.selector, MEASUREMENT));
        verifier.verify(a, s.peerKey, ev);
        vm.prank(owner);
        verifier.setMeasurement(MEASUREMENT, true);
        (,,, bytes32 m) = verifier.verify(a, s.peerKey, signed(s, SERVICE_KEY));
        vm.assertEq(m, MEASUREMENT);
        (bool allowed, uint256 pinned) = verifier.measurementAllowed(MEASUREMENT);
        vm.assertTrue(allowed);
        vm.assertEq(pinned, 2);
    }

    function test_revert_StatementBeforeRotation() public {
        V.Statement memory s = statement(a);
        vm.warp(block.timestamp + 100);
        vm.prank(owner);
        verifier.setAttester(vm.addr(OTHER_KEY));
        // The old key no longer signs; the new key cannot backdate a statement either.
        bytes memory ev = signed(s, SERVICE_KEY);
        vm.expectRevert(abi.encodeWithSelector(V.WrongSigner.selector, vm.addr(SERVICE_KEY), vm.addr(OTHER_KEY)));
        verifier.verify(a, s.peerKey, ev);
        ev = signed(s, OTHER_KEY);
        vm.expectRevert(abi.encodeWithSelector(V.StatementBeforeRotation.selector, s.issuedAt, block.timestamp));
        verifier.verify(a, s.peerKey, ev);
        s.issuedAt = uint64(block.timestamp);
        verifier.verify(a, s.peerKey, signed(s, OTHER_KEY));
    }

    function test_revert_OwnableUnauthorizedAccount() public {
        vm.prank(stranger);
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, stranger));
        verifier.setAttester(stranger);
        vm.prank(stranger);
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, stranger));
        verifier.setMeasurement(bytes32(0), true);
    }

    function test_revert_ZeroAttester() public {
        vm.prank(owner);
        vm.expectRevert(V.ZeroAttester.selector);
        verifier.setAttester(address(0));
    }
}

contract SubmitAttestationTest is AttestationBase {
    address internal a;

    function setUp() public override {
        super.setUp();
        a = op(1);
        register(a, MIN_STAKE);
    }

    function test_records() public {
        V.Statement memory s = statement(a);
        vm.expectEmit();
        emit I.AttestationSubmitted(a, address(verifier), 1, MEASUREMENT, s.peerKey, s.expiresAt);
        attest(a);
        (address v, uint64 issuedAt, uint64 expiresAt, uint8 teeType, bytes32 m, bytes32 peerKey, bool ok) =
            bsm.attestationOf(a);
        vm.assertEq(v, address(verifier));
        vm.assertEq(issuedAt, s.issuedAt);
        vm.assertEq(expiresAt, s.expiresAt);
        vm.assertEq(teeType, 1);
        vm.assertEq(m, MEASUREMENT);
        vm.assertEq(peerKey, s.peerKey);
        vm.assertTrue(ok);
    }

    function test_revert_VerifierNotAllowed_strangers_own_verifier() public {
        YesVerifier yes = new YesVerifier();
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.VerifierNotAllowed.selector, address(yes)));
        bsm.submitAttestation(address(yes), "");
        vm.assertFalse(valid(a));
    }

    function test_revert_NotRegistered() public {
        vm.prank(stranger);
        vm.expectRevert(abi.encodeWithSelector(I.NotRegistered.selector, stranger));
        bsm.submitAttestation(address(verifier), "");
    }

    function test_revert_WrongOperator_replay_of_another_operators_statement() public {
        address b = op(2);
        register(b, MIN_STAKE);
        bytes memory ofA = signed(statement(a), SERVICE_KEY);
        vm.prank(b);
        vm.expectRevert(abi.encodeWithSelector(V.WrongOperator.selector, a, b));
        bsm.submitAttestation(address(verifier), ofA);
    }

    function test_revert_WrongPeerKey_statement_for_the_old_peer_key() public {
        bytes memory old = signed(statement(a), SERVICE_KEY);
        bytes32 newKey = keccak256("new peer");
        vm.prank(a);
        bsm.updateOperator(newKey, addrsOf(1), "cpu:2", 0);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(V.WrongPeerKey.selector, peerKeyOf(a), newKey));
        bsm.submitAttestation(address(verifier), old);
    }

    function test_revert_AttestationExpired_from_a_careless_verifier() public {
        StaleVerifier stale = new StaleVerifier();
        vm.prank(developer);
        bsm.setAttestationVerifier(address(stale), true);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(I.AttestationExpired.selector, block.timestamp, block.timestamp));
        bsm.submitAttestation(address(stale), "");
    }

    function test_revert_StatementExpired() public {
        bytes memory ev = signed(statement(a), SERVICE_KEY);
        vm.warp(block.timestamp + VALIDITY);
        vm.prank(a);
        vm.expectRevert(abi.encodeWithSelector(V.StatementExpired.selector, block.timestamp, block.timestamp));
        bsm.submitAttestation(address(verifier), ev);
    }

    function test_peer_key_change_clears_it() public {
        attest(a);
        vm.prank(a);
        bsm.updateOperator(peerKeyOf(a), addrsOf(2), "gpu", 0); // same key: kept
        vm.assertTrue(valid(a));
        vm.prank(a);
        bsm.updateOperator(keccak256("new peer"), addrsOf(2), "gpu", 0);
        (address v,, uint64 expiresAt,,,, bool ok) = bsm.attestationOf(a);
        vm.assertEq(v, address(0));
        vm.assertEq(expiresAt, 0);
        vm.assertFalse(ok);
    }

    function test_reregistering_with_another_peer_key_voids_it() public {
        attest(a);
        vm.prank(a);
        bsm.deregisterOperator();
        vm.deal(a, MIN_STAKE);
        vm.prank(a);
        bsm.registerOperator{value: MIN_STAKE}(keccak256("another peer"), addrsOf(1), "", 0);
        vm.assertFalse(valid(a));
    }
}

contract SetAttestationVerifierTest is AttestationBase {
    function test_allows_and_disallows() public {
        vm.assertTrue(bsm.isAttestationVerifier(address(verifier)));
        vm.expectEmit();
        emit I.AttestationVerifierSet(address(verifier), false);
        vm.prank(developer);
        bsm.setAttestationVerifier(address(verifier), false);
        vm.assertFalse(bsm.isAttestationVerifier(address(verifier)));
    }

    function test_revert_NotDeveloper() public {
        YesVerifier yes = new YesVerifier();
        vm.prank(stranger);
        vm.expectRevert(abi.encodeWithSelector(I.NotDeveloper.selector, stranger, developer));
        bsm.setAttestationVerifier(address(yes), true);
        vm.prank(op(1));
        vm.expectRevert(abi.encodeWithSelector(I.NotDeveloper.selector, op(1), developer));
        bsm.setAttestationVerifier(address(verifier), false);
    }

    function test_revert_VerifierHasNoCode() public {
        vm.prank(developer);
        vm.expectRevert(abi.encodeWithSelector(I.VerifierHasNoCode.selector, stranger));
        bsm.setAttestationVerifier(stranger, true);
    }

    function test_revert_TooManyVerifiers() public {
        vm.startPrank(developer);
        for (uint256 i = 1; i < 8; ++i) {
            bsm.setAttestationVerifier(address(new YesVerifier()), true);
        }
        address ninth = address(new YesVerifier());
        vm.expectRevert(abi.encodeWithSelector(I.TooManyVerifiers.selector, 8, 8));
        bsm.setAttestationVerifier(ninth, true);
        // Disallowing frees a place; allowing again what is allowed changes nothing.
        bsm.setAttestationVerifier(address(verifier), true);
        bsm.setAttestationVerifier(address(verifier), false);
        bsm.setAttestationVerifier(ninth, true);
        vm.stopPrank();
        vm.assertTrue(bsm.isAttestationVerifier(ninth));
    }
}

/// joinJob of a teeRequired job.
contract JoinTeeJobTest is AttestationBase {
    address[] internal ops;
    uint256 internal jobId;

    function setUp() public override {
        super.setUp();
        ops = registerN(2);
        jobId = teeJob();
    }

    function test_revert_AttestationRequired_without() public {
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.AttestationRequired.selector, jobId, ops[0], 0, block.timestamp));
        bsm.joinJob(jobId);
    }

    function test_joins_with_a_valid_attestation_under_the_gas_cap() public {
        attest(ops[0]);
        attest(ops[1]);
        vm.prank(ops[0]);
        bsm.joinJob(jobId);
        vm.assertLe(vm.lastCallGas().gasTotalUsed, 200_000, "teeRequired joinJob");
        vm.prank(ops[1]);
        bsm.joinJob(jobId);
        vm.assertEq(bsm.getMembers(jobId).length, 2);
        vm.assertTrue(status(jobId) == I.JobStatus.Running);
    }

    function test_revert_AttestationRequired_expired() public {
        attest(ops[0]);
        (,, uint64 expiresAt,,,,) = bsm.attestationOf(ops[0]);
        vm.warp(expiresAt);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.AttestationRequired.selector, jobId, ops[0], expiresAt, expiresAt));
        bsm.joinJob(jobId);
    }

    function test_revert_AttestationRequired_verifier_disallowed() public {
        attest(ops[0]);
        vm.prank(developer);
        bsm.setAttestationVerifier(address(verifier), false);
        (,, uint64 expiresAt,,,,) = bsm.attestationOf(ops[0]);
        vm.prank(ops[0]);
        vm.expectRevert(
            abi.encodeWithSelector(I.AttestationRequired.selector, jobId, ops[0], expiresAt, block.timestamp)
        );
        bsm.joinJob(jobId);
    }

    function test_revert_AttestationRequired_after_key_rotation() public {
        attest(ops[0]);
        vm.warp(block.timestamp + 1);
        vm.prank(owner);
        verifier.setAttester(vm.addr(OTHER_KEY));
        vm.assertFalse(valid(ops[0]));
        vm.prank(ops[0]);
        vm.expectRevert(); // AttestationRequired
        bsm.joinJob(jobId);
        // A statement by the new key counts again.
        bytes memory ev = signed(statement(ops[0]), OTHER_KEY);
        vm.prank(ops[0]);
        bsm.submitAttestation(address(verifier), ev);
        vm.prank(ops[0]);
        bsm.joinJob(jobId);
    }

    function test_revert_AttestationRequired_after_peer_key_change() public {
        attest(ops[0]);
        vm.prank(ops[0]);
        bsm.updateOperator(keccak256("new peer"), addrsOf(1), "", 0);
        vm.prank(ops[0]);
        vm.expectRevert(abi.encodeWithSelector(I.AttestationRequired.selector, jobId, ops[0], 0, block.timestamp));
        bsm.joinJob(jobId);
    }

    function test_a_job_without_teeRequired_needs_none() public {
        uint256 plain = createJob(spec(2, 2, 1));
        joinAll(plain, ops);
        vm.assertEq(bsm.getMembers(plain).length, 2);
    }

    /// Attestations count at join: a member whose attestation expires mid-job keeps its seat.
    function test_a_member_whose_attestation_expires_keeps_its_seat() public {
        V.Statement memory st = statement(ops[0]);
        st.expiresAt = uint64(block.timestamp) + 10 minutes; // ends inside the first epoch
        bytes memory ev = signed(st, SERVICE_KEY);
        vm.prank(ops[0]);
        bsm.submitAttestation(address(verifier), ev);
        attest(ops[1]);
        joinAll(jobId, ops);
        vm.warp(st.expiresAt + 1);
        vm.assertFalse(valid(ops[0]));
        submitAll(jobId, keccak256("ckpt"));
        finalize(jobId);
        vm.assertEq(state(jobId).epoch, 1);
        vm.assertEq(bsm.getMembers(jobId).length, 2);
    }
}
