// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";

import {IAttestationVerifier} from "./interfaces/IAttestationVerifier.sol";
import {ISignedAttestationVerifier} from "./interfaces/ISignedAttestationVerifier.sol";

/// @title SignedAttestationVerifier
/// @notice See ISignedAttestationVerifier: accepts statements signed by the attestation service
/// key its owner (the deployer) registered.
contract SignedAttestationVerifier is ISignedAttestationVerifier, EIP712, Ownable {
    bytes32 private constant _STATEMENT_TYPEHASH = keccak256(
        "Statement(address operator,bytes32 peerKey,uint8 teeType,bytes32 measurement,bytes32 reportDataHash,uint64 issuedAt,uint64 expiresAt)"
    );

    address private _attester;
    uint64 private _validSince;
    uint256 private _pinned;
    mapping(bytes32 measurement => bool) private _measurements;

    constructor(address owner_, address attester_) EIP712("DtrainAttestation", "1") Ownable(owner_) {
        _setAttester(attester_);
    }

    /// @inheritdoc ISignedAttestationVerifier
    function attester() external view returns (address) {
        return _attester;
    }

    /// @inheritdoc ISignedAttestationVerifier
    function setAttester(address newAttester) external onlyOwner {
        _setAttester(newAttester);
    }

    /// @inheritdoc ISignedAttestationVerifier
    function setMeasurement(bytes32 measurement, bool allowed) external onlyOwner {
        if (_measurements[measurement] != allowed) {
            _measurements[measurement] = allowed;
            _pinned = allowed ? _pinned + 1 : _pinned - 1;
        }
        emit MeasurementSet(measurement, allowed);
    }

    /// @inheritdoc ISignedAttestationVerifier
    function measurementAllowed(bytes32 measurement) external view returns (bool allowed, uint256 pinned) {
        pinned = _pinned;
        allowed = pinned == 0 || _measurements[measurement];
    }

    /// @inheritdoc ISignedAttestationVerifier
    function statementDigest(Statement calldata s) external view returns (bytes32) {
        return _digest(s);
    }

    function _digest(Statement memory s) private view returns (bytes32) {
        return _hashTypedDataV4(
            keccak256(
                abi.encode(
                    _STATEMENT_TYPEHASH,
                    s.operator,
                    s.peerKey,
                    s.teeType,
                    s.measurement,
                    s.reportDataHash,
                    s.issuedAt,
                    s.expiresAt
                )
            )
        );
    }

    /// @notice `evidence` = `abi.encode(Statement, bytes signature)`.
    function verify(address operator, bytes32 peerKey, bytes calldata evidence)
        external
        view
        returns (uint64 issuedAt, uint64 expiresAt, uint8 teeType, bytes32 measurement)
    {
        (Statement memory s, bytes memory signature) = abi.decode(evidence, (Statement, bytes));
        (address signer,,) = ECDSA.tryRecover(_digest(s), signature);
        require(signer == _attester, WrongSigner(signer, _attester));
        require(s.operator == operator, WrongOperator(s.operator, operator));
        require(s.peerKey == peerKey, WrongPeerKey(s.peerKey, peerKey));
        require(s.teeType == 1 || s.teeType == 2, UnknownTeeType(s.teeType));
        require(s.expiresAt > s.issuedAt, EmptyValidity(s.issuedAt, s.expiresAt));
        require(s.issuedAt <= block.timestamp, StatementNotYetValid(s.issuedAt, block.timestamp));
        require(s.issuedAt >= _validSince, StatementBeforeRotation(s.issuedAt, _validSince));
        require(block.timestamp < s.expiresAt, StatementExpired(s.expiresAt, block.timestamp));
        require(_pinned == 0 || _measurements[s.measurement], MeasurementNotAllowed(s.measurement));
        return (s.issuedAt, s.expiresAt, s.teeType, s.measurement);
    }

    /// @inheritdoc IAttestationVerifier
    function validSince() external view returns (uint64) {
        return _validSince;
    }

    function _setAttester(address newAttester) private {
        require(newAttester != address(0), ZeroAttester());
        _attester = newAttester;
        _validSince = uint64(block.timestamp);
        emit AttesterSet(newAttester, _validSince);
    }
}
