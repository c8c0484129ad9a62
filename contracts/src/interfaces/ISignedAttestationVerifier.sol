// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IAttestationVerifier} from "./IAttestationVerifier.sol";

/// @title ISignedAttestationVerifier
/// @notice An attestation verifier that accepts a statement signed by an attestation service
/// whose key the verifier's owner registered. The service (off-chain) checks the TEE report and
/// that its report data binds the chain, the BSM, the operator and its peer key; this contract
/// checks only the service's EIP-712 signature, the statement's time window, the operator and
/// peer key it names and, when the owner pinned any, its measurement. It does NOT check the
/// hardware vendor's certificate chain: what it proves is "the key the owner trusts vouched for
/// this operator, peer key and measurement until `expiresAt`".
/// @dev `evidence` for `verify` is `abi.encode(Statement, bytes signature)`; the signature is
/// over the EIP-712 typed data `Statement(address operator,bytes32 peerKey,uint8 teeType,
/// bytes32 measurement,bytes32 reportDataHash,uint64 issuedAt,uint64 expiresAt)` in the domain
/// (name "DtrainAttestation", version "1", this chain, this contract).
interface ISignedAttestationVerifier is IAttestationVerifier {
    /// @notice What the attestation service vouches for.
    struct Statement {
        address operator;
        bytes32 peerKey;
        uint8 teeType;
        bytes32 measurement;
        /// sha256 of the TEE report's 64 bytes of report data (audit trail: the binding the
        /// service checked).
        bytes32 reportDataHash;
        uint64 issuedAt;
        uint64 expiresAt;
    }

    /// @notice the statement expired at `expiresAt` (now `nowTs`)
    error StatementExpired(uint256 expiresAt, uint256 nowTs);
    /// @notice the statement is issued at `issuedAt`, in the future (now `nowTs`)
    error StatementNotYetValid(uint256 issuedAt, uint256 nowTs);
    /// @notice the statement was issued at `issuedAt`, before the key in use since `validSince`
    error StatementBeforeRotation(uint256 issuedAt, uint256 validSince);
    /// @notice the statement is signed by `signer`, not by the attestation service key `attester`
    error WrongSigner(address signer, address attester);
    /// @notice measurement `measurement` is not one the verifier's owner allowed
    error MeasurementNotAllowed(bytes32 measurement);
    /// @notice the statement is for operator `bound`, not `operator`
    error WrongOperator(address bound, address operator);
    /// @notice the statement is for peer key `bound`, not the operator's `peerKey`
    error WrongPeerKey(bytes32 bound, bytes32 peerKey);
    /// @notice TEE type `teeType` is not 1 (TDX) or 2 (SEV-SNP)
    error UnknownTeeType(uint8 teeType);
    /// @notice the statement expires at `expiresAt`, not after its issue time `issuedAt`
    error EmptyValidity(uint256 issuedAt, uint256 expiresAt);
    /// @notice the attestation service key must not be the zero address
    error ZeroAttester();

    /// @notice The owner registered `attester` as the attestation service key; statements
    /// issued before `validSince` stop counting.
    event AttesterSet(address indexed attester, uint64 validSince);
    /// @notice The owner allowed (or disallowed) measurement `measurement`.
    event MeasurementSet(bytes32 indexed measurement, bool allowed);

    /// @notice The attestation service key whose signature counts.
    function attester() external view returns (address);

    /// @notice Replaces the attestation service key (owner only). Every statement issued before
    /// now stops counting, including those the BSM already accepted.
    function setAttester(address newAttester) external;

    /// @notice Allows or disallows a measurement (owner only). While none is allowed, any
    /// measurement passes; once one is, only allowed ones do.
    function setMeasurement(bytes32 measurement, bool allowed) external;

    /// @notice Whether `measurement` is allowed, and how many are (0: any passes).
    function measurementAllowed(bytes32 measurement) external view returns (bool allowed, uint256 pinned);

    /// @notice The EIP-712 digest the attestation service signs for `s`.
    function statementDigest(Statement calldata s) external view returns (bytes32);
}
