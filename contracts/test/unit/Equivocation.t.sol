// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

/// reportEquivocation: two gossip envelopes one member signed for one round, naming two
/// packets, make that member slashed at the fabrication rate and unpaid when the epoch settles.
contract ReportEquivocationTest is BaseTest {
    uint256[] internal keys;
    address[] internal members;
    uint256 internal jobId;

    function setUp() public override {
        super.setUp();
        for (uint256 i; i < 3; ++i) {
            keys.push(uint256(keccak256(abi.encode("member key", i))));
            members.push(vm.addr(keys[i]));
            register(members[i], MIN_STAKE);
        }
        jobId = createJob(spec(3, 3, 2));
        joinAll(jobId, members);
    }

    // ------------------------------------------------------------ envelopes, as nodes sign them

    struct Env {
        uint8 kind;
        uint64 chainId;
        address contractAddress;
        uint256 job;
        uint64 attempt;
        uint64 round;
        address sender;
        bytes32 payloadSha256;
        bytes chunk;
    }

    function env(uint256 i, uint64 round, bytes32 payloadSha256) internal view returns (Env memory e) {
        e = Env(
            1, uint64(block.chainid), address(bsm), jobId, state(jobId).attempt, round, members[i], payloadSha256, ""
        );
    }

    function encode(Env memory e, uint256 key) internal pure returns (bytes memory) {
        bytes memory fields = abi.encodePacked(
            e.kind,
            e.chainId,
            e.contractAddress,
            e.job,
            e.attempt,
            e.round,
            e.sender,
            uint32(1000),
            e.payloadSha256,
            uint16(0),
            uint16(1),
            uint32(e.chunk.length)
        );
        bytes32 digest = keccak256(abi.encodePacked("dtrain/gossip-packet/v2", fields, keccak256(e.chunk)));
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(key, digest);
        return abi.encodePacked("DTGE", uint8(2), fields, e.chunk, r, s, v);
    }

    function proof(uint256 i) internal view returns (bytes memory a, bytes memory b) {
        a = encode(env(i, 4, keccak256("packet a")), keys[i]);
        b = encode(env(i, 4, keccak256("packet b")), keys[i]);
    }

    // ------------------------------------------------------------------------------ the game

    function test_reportEquivocation_slashesAtFabricationRateAndDoesNotPay() public {
        (bytes memory a, bytes memory b) = proof(2);
        vm.expectEmit();
        emit I.EquivocationProven(jobId, 0, members[2], 4, reporter);
        vm.prank(reporter);
        bsm.reportEquivocation(jobId, a, b);
        vm.assertEq(bsm.equivocators(jobId), 1 << 2);
        submitAll(jobId, keccak256("ckpt")); // it even votes with the quorum
        finalize(jobId);
        vm.assertEq(bsm.stakeOf(members[2], members[2]), MIN_STAKE * 9 / 10, "equivocator not slashed");
        vm.assertEq(bsm.creditOf(members[2]), 0, "equivocator paid");
        for (uint256 i; i < 2; ++i) {
            vm.assertEq(bsm.stakeOf(members[i], members[i]), MIN_STAKE, "honest member slashed");
            vm.assertEq(bsm.creditOf(members[i]), PRICE * 40 / 100, "honest member unpaid");
        }
        assertConserved();
    }

    function test_reportEquivocation_packetChunksWithBytesCountToo() public {
        Env memory x = env(1, 7, keccak256("x"));
        Env memory y = env(1, 7, keccak256("y"));
        (x.kind, y.kind, x.chunk, y.chunk) = (0, 0, "some packet bytes", "other bytes");
        bsm.reportEquivocation(jobId, encode(x, keys[1]), encode(y, keys[1]));
        vm.assertEq(bsm.equivocators(jobId), 1 << 1);
    }

    function test_revert_EquivocationKnown() public {
        (bytes memory a, bytes memory b) = proof(0);
        bsm.reportEquivocation(jobId, a, b);
        vm.expectRevert(abi.encodeWithSelector(I.EquivocationKnown.selector, jobId, members[0]));
        bsm.reportEquivocation(jobId, b, a);
    }

    function test_revert_NotAnEquivocation() public {
        (bytes memory a,) = proof(0);
        vm.expectRevert(abi.encodeWithSelector(I.NotAnEquivocation.selector, members[0], members[0], 4, 4));
        bsm.reportEquivocation(jobId, a, a); // one packet
        bytes memory otherRound = encode(env(0, 5, keccak256("packet b")), keys[0]);
        vm.expectRevert(abi.encodeWithSelector(I.NotAnEquivocation.selector, members[0], members[0], 4, 5));
        bsm.reportEquivocation(jobId, a, otherRound);
        bytes memory otherSender = encode(env(1, 4, keccak256("packet b")), keys[1]);
        vm.expectRevert(abi.encodeWithSelector(I.NotAnEquivocation.selector, members[0], members[1], 4, 4));
        bsm.reportEquivocation(jobId, a, otherSender);
    }

    function test_revert_EnvelopeNotSignedBySender() public {
        (bytes memory a,) = proof(0);
        // member 1 signs an envelope that names member 0 as its sender
        bytes memory forged = encode(env(0, 4, keccak256("packet b")), keys[1]);
        vm.expectRevert(abi.encodeWithSelector(I.EnvelopeNotSignedBySender.selector, members[0], members[1]));
        bsm.reportEquivocation(jobId, a, forged);
    }

    function test_revert_ProofForAnotherJob() public {
        (bytes memory a,) = proof(0);
        Env memory e = env(0, 4, keccak256("packet b"));
        e.job = jobId + 1;
        vm.expectRevert(abi.encodeWithSelector(I.ProofForAnotherJob.selector, block.chainid, address(bsm), jobId + 1));
        bsm.reportEquivocation(jobId, a, encode(e, keys[0]));
        e = env(0, 4, keccak256("packet b"));
        e.contractAddress = address(0xBEEF);
        vm.expectRevert(abi.encodeWithSelector(I.ProofForAnotherJob.selector, block.chainid, address(0xBEEF), jobId));
        bsm.reportEquivocation(jobId, a, encode(e, keys[0]));
    }

    function test_revert_ProofNotCurrentAttempt() public {
        (bytes memory a, bytes memory b) = proof(0);
        submitAll(jobId, keccak256("ckpt"));
        finalize(jobId); // epoch 0's attempt is settled: its proofs come too late
        uint64 current = state(jobId).attempt;
        vm.expectRevert(abi.encodeWithSelector(I.ProofNotCurrentAttempt.selector, jobId, current - 1, current));
        bsm.reportEquivocation(jobId, a, b);
    }

    function test_revert_NotMember() public {
        uint256 outsiderKey = uint256(keccak256("outsider"));
        Env memory x = env(0, 4, keccak256("a"));
        Env memory y = env(0, 4, keccak256("b"));
        (x.sender, y.sender) = (vm.addr(outsiderKey), vm.addr(outsiderKey));
        vm.expectRevert(abi.encodeWithSelector(I.NotMember.selector, jobId, vm.addr(outsiderKey)));
        bsm.reportEquivocation(jobId, encode(x, outsiderKey), encode(y, outsiderKey));
    }

    function test_revert_MalformedEnvelope() public {
        (bytes memory a, bytes memory b) = proof(0);
        bytes memory cut = new bytes(b.length - 1);
        for (uint256 i; i < cut.length; ++i) {
            cut[i] = b[i];
        }
        vm.expectRevert(abi.encodeWithSelector(I.MalformedEnvelope.selector, cut.length));
        bsm.reportEquivocation(jobId, a, cut);
        b[0] = "X"; // magic
        vm.expectRevert(abi.encodeWithSelector(I.MalformedEnvelope.selector, b.length));
        bsm.reportEquivocation(jobId, a, b);
    }

    function testFuzz_reportEquivocation_randomBytesNeverRecord(bytes calldata junk) public {
        (bytes memory a,) = proof(0);
        try bsm.reportEquivocation(jobId, a, junk) {
            revert("junk accepted as a proof");
        } catch {}
        vm.assertEq(bsm.equivocators(jobId), 0);
    }
}

/// A member that committed and then kept its vote back (it saw the others' and would lose)
/// pays the fabrication rate, not the dropout rate; one that never committed is a dropout.
contract WithheldRevealTest is BaseTest {
    function test_withheldReveal_costsTheFabricationRate() public {
        (uint256 jobId, address[] memory ops) = runningJob(4, 2);
        uint32[] memory p = fullParticipation(jobId);
        for (uint256 i; i < 3; ++i) {
            submit(jobId, ops[i], keccak256("quorum"), p);
        }
        // ops[3] commits a losing vote and withholds it
        (, I.JobState memory st) = bsm.getJob(jobId);
        bytes32 c = bsm.commitmentHash(
            jobId, st.epoch, ops[3], keccak256("other"), p, transcriptOf(ops[3]), bytes32(uint256(7))
        );
        vm.prank(ops[3]);
        bsm.commitCheckpoint(jobId, st.epoch, c);
        uint256 before = bsm.getPool(ops[3]).totalAssets;
        reveal(jobId);
        vm.warp(bsm.revealDeadline(jobId) + 1);
        vm.expectEmit();
        emit I.Slashed(ops[3], jobId, 0, I.SlashReason.WithheldReveal, before * 1000 / 10000, reporter);
        vm.prank(reporter);
        bsm.finalizeEpoch(jobId, 0);
        vm.assertEq(bsm.getPool(ops[3]).totalAssets, before - before * 1000 / 10000);
        vm.assertEq(bsm.creditOf(ops[3]), 0);
        assertConserved();
    }

    function test_neverCommitted_isADropout() public {
        (uint256 jobId, address[] memory ops) = runningJob(4, 2);
        uint32[] memory p = fullParticipation(jobId);
        p[3] = 0; // absent from every round
        for (uint256 i; i < 3; ++i) {
            submit(jobId, ops[i], keccak256("quorum"), p);
        }
        uint256 before = bsm.getPool(ops[3]).totalAssets;
        finalize(jobId);
        vm.assertEq(bsm.getPool(ops[3]).totalAssets, before - before * 500 / 10000);
        assertConserved();
    }
}
