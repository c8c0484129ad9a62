// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

import {IDistributedTrainingBSMTypes} from "../interfaces/IDistributedTrainingBSM.sol";

/// @title GossipEnvelope
/// @notice Reads the signed gossip envelope of the nodes' sync protocol (docs/protocol.md,
/// section 2): one chunk of a member's DeMo packet, or its commitment to the packet, for one
/// round. Layout (big-endian): magic "DTGE" (4), version 2 (1), kind (1), chainId (8),
/// contract (20), jobId (32), epoch (8), round (8), sender (20), payloadLen (4),
/// payloadSha256 (32), chunkIndex (2), chunkCount (2), chunkLen (4), chunk (chunkLen),
/// signature r || s || v (65). The signature is over
/// keccak256("dtrain/gossip-packet/v2" || bytes 5..146 || keccak256(chunk)), a raw hash.
library GossipEnvelope {
    struct Header {
        uint64 chainId;
        address contractAddress;
        uint256 jobId;
        uint64 epoch; // the epoch attempt
        uint64 round;
        address sender;
        bytes32 payloadSha256;
        address signer; // recovered from the signature; address(0) when none is
    }

    uint256 private constant _HEAD = 146;
    uint256 private constant _OVERHEAD = _HEAD + 65;

    /// @notice Parses `data` and recovers its signer; reverts with `MalformedEnvelope` on
    /// anything that is not a well-formed envelope.
    function read(bytes calldata data) internal pure returns (Header memory h) {
        uint256 n = data.length;
        require(n >= _OVERHEAD, IDistributedTrainingBSMTypes.MalformedEnvelope(n));
        uint256 chunkLen = uint32(bytes4(data[142:146]));
        require(n == _OVERHEAD + chunkLen, IDistributedTrainingBSMTypes.MalformedEnvelope(n));
        require(
            bytes4(data[0:4]) == "DTGE" && data[4] == 0x02 && uint8(data[5]) <= 1,
            IDistributedTrainingBSMTypes.MalformedEnvelope(n)
        );
        h.chainId = uint64(bytes8(data[6:14]));
        h.contractAddress = address(bytes20(data[14:34]));
        h.jobId = uint256(bytes32(data[34:66]));
        h.epoch = uint64(bytes8(data[66:74]));
        h.round = uint64(bytes8(data[74:82]));
        h.sender = address(bytes20(data[82:102]));
        h.payloadSha256 = bytes32(data[106:138]);
        uint256 sig = _HEAD + chunkLen;
        bytes32 digest =
            keccak256(abi.encodePacked("dtrain/gossip-packet/v2", data[5:_HEAD], keccak256(data[_HEAD:sig])));
        (h.signer,,) = ECDSA.tryRecover(
            digest, uint8(data[sig + 64]), bytes32(data[sig:sig + 32]), bytes32(data[sig + 32:sig + 64])
        );
    }
}
