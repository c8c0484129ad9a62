// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @title IAttestationVerifier
/// @notice What the BSM asks of a TEE attestation verifier. The BSM's blueprint developer
/// allows verifiers (`setAttestationVerifier`); an operator's attestation counts for
/// `teeRequired` jobs only while the verifier that accepted it is still allowed, it has not
/// expired, it was issued no earlier than the verifier's `validSince()` and it is bound to the
/// operator's current peer key.
interface IAttestationVerifier {
    /// @notice Checks `evidence` that `operator`, with libp2p peer key `peerKey`, runs in a TEE;
    /// reverts (with a custom error) when it does not hold.
    /// @param evidence verifier-specific encoding of the attestation.
    /// @return issuedAt unix seconds at which the attestation was made.
    /// @return expiresAt unix seconds from which the attestation no longer counts.
    /// @return teeType 1 = Intel TDX, 2 = AMD SEV-SNP.
    /// @return measurement the TEE's launch measurement (MRTD / SNP MEASUREMENT, hashed to 32 bytes).
    function verify(address operator, bytes32 peerKey, bytes calldata evidence)
        external
        view
        returns (uint64 issuedAt, uint64 expiresAt, uint8 teeType, bytes32 measurement);

    /// @notice Attestations issued before this time no longer count, even those already
    /// accepted (the verifier's trust root changed, e.g. its signing key was rotated).
    function validSince() external view returns (uint64);
}
