// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";

import {IDistributedTrainingBSMSeats} from "./interfaces/IDistributedTrainingBSM.sol";
import {BSMStorage} from "./BSMStorage.sol";

/// @title BSMSeats
/// @notice The seat draw of IDistributedTrainingBSMSeats, part of the hooks extension: it runs
/// on the BSM's storage, among the applicants the BSM's `_join` recorded as members of the
/// `Open` job.
abstract contract BSMSeats is BSMStorage, IDistributedTrainingBSMSeats {
    /// @inheritdoc IDistributedTrainingBSMSeats
    uint256 public constant SEAT_WEIGHT_CAP = _SEAT_WEIGHT_CAP;

    /// @inheritdoc IDistributedTrainingBSMSeats
    function drawSeats(uint256 jobId) external {
        JobState storage j = _jobs[jobId];
        require(j.status == JobStatus.Open, JobNotOpen(jobId, j.status));
        uint256 drawAt = _seatDrawAt[jobId];
        require(drawAt != 0 && block.timestamp >= drawAt, SeatDrawNotDue(jobId, drawAt, block.timestamp));
        uint256 seedBlock = _seatSeedBlock[jobId];
        bytes32 hash = seedBlock == 0 ? bytes32(0) : blockhash(seedBlock);
        if (hash == bytes32(0) && (seedBlock == 0 || block.number > seedBlock)) {
            // Sealed (or resealed, a seed out of the chain's reach): weights as of this block,
            // drawn by the next block's hash.
            _seatSeedBlock[jobId] = uint64(block.number + 1);
            emit SeatDrawSealed(jobId, j.epoch, block.number + 1);
            return;
        }
        require(block.number > seedBlock, SeedNotMined(seedBlock, block.number));
        delete _seatDrawAt[jobId];
        delete _seatSeedBlock[jobId];
        address[] storage list = _members[jobId];
        address[] memory a = list;
        uint256 n = a.length;
        uint256 want = Math.min(n, _specs[jobId].maxOperators);
        uint256[] memory w = new uint256[](n);
        for (uint256 i; i < n; ++i) {
            w[i] = _drawWeightAt(a[i], seedBlock - 1) + 1;
        }
        // `_nextAttempt` is the attempt the draw opens: no two draws share a seed.
        _drawByWeight(w, want, uint256(keccak256(abi.encode(hash, jobId, _nextAttempt))));
        address[] memory seated = new address[](want);
        uint256 k;
        for (uint256 i; i < n; ++i) {
            if (w[i] == 0) {
                seated[k++] = a[i];
            } else {
                _release(jobId, a[i]);
                emit SeatNotDrawn(jobId, j.epoch, a[i]);
            }
        }
        _writeMembers(list, seated, want);
        emit SeatsDrawn(jobId, j.epoch, seated);
        _openAttempt(jobId, j);
    }

    /// @inheritdoc IDistributedTrainingBSMSeats
    function drawVacancies(uint256 jobId, bool inPieces) external returns (uint256 seated) {
        require(msg.sender == address(this), OnlySelf(msg.sender));
        JobState storage j = _jobs[jobId];
        address[] storage queue = _pending[jobId];
        address[] storage members = _members[jobId];
        uint256 free = _specs[jobId].maxOperators - members.length;
        if (inPieces) free = Math.min(free, _HOOK_SEATS);
        address[] memory a = queue;
        uint256 n = a.length;
        uint256[] memory w = new uint256[](n);
        if (n > free && _params.seatDrawWindow == 0) {
            // No draws (a development chain): the first `free` queued, first come.
            for (uint256 i = free; i < n; ++i) {
                w[i] = 1;
            }
        } else if (n > free) {
            if (free == 0) return 0;
            uint256 seedBlock = _seatSeedBlock[jobId];
            bytes32 hash = seedBlock == 0 || block.number <= seedBlock ? bytes32(0) : blockhash(seedBlock);
            if (hash == bytes32(0)) {
                emit VacancyDrawDeferred(jobId, j.epoch, n);
                return 0;
            }
            for (uint256 i; i < n; ++i) {
                w[i] = _drawWeightAt(a[i], seedBlock - 1) + 1;
            }
            // The attempt that ends here: no two draws share a seed.
            _drawByWeight(w, free, uint256(keccak256(abi.encode(hash, jobId, j.attempt))));
        }
        // Drawn (weight 0 now; everyone when all fit) are seated in queue order; the others
        // keep their place (a removal moves the last one into the gap).
        address[] memory drawn = new address[](Math.min(n, free));
        for (uint256 i; i < n; ++i) {
            if (w[i] != 0) continue;
            drawn[seated++] = a[i];
            _membership[jobId][a[i]] = Membership.Active;
            members.push(a[i]);
        }
        for (uint256 i = n; i > 0; --i) {
            if (w[i - 1] != 0) continue;
            queue[i - 1] = queue[queue.length - 1];
            queue.pop();
        }
        if (n > free && _params.seatDrawWindow > 0) emit SeatsDrawn(jobId, j.epoch, drawn);
    }

    /// @inheritdoc IDistributedTrainingBSMSeats
    function displaceLightest(uint256 jobId, address newcomer) external {
        require(msg.sender == address(this), OnlySelf(msg.sender));
        JobState storage j = _jobs[jobId];
        address[] storage list = j.status == JobStatus.Running ? _pending[jobId] : _members[jobId];
        uint256 lightest;
        uint256 least = type(uint256).max;
        for (uint256 i; i < list.length; ++i) {
            uint256 w = _seatWeight(list[i]);
            if (w < least) (lightest, least) = (i, w);
        }
        uint256 weight = _seatWeight(newcomer);
        require(weight > least, ApplicantsFull(jobId, least, weight));
        address out = list[lightest];
        _removeFrom(list, out);
        _release(jobId, out);
        emit SeatNotDrawn(jobId, j.epoch, out);
    }

    /// @inheritdoc IDistributedTrainingBSMSeats
    function seatDrawAt(uint256 jobId) external view returns (uint256) {
        return _seatDrawAt[jobId];
    }

    /// @inheritdoc IDistributedTrainingBSMSeats
    function seatWeight(address operator) external view returns (uint256) {
        return _seatWeight(operator);
    }
}
