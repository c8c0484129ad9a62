// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {BaseTest} from "../Base.t.sol";
import {IDistributedTrainingBSMTypes as I} from "../../src/interfaces/IDistributedTrainingBSM.sol";

contract RecipeTest is BaseTest {
    /// The recipe pin is stored as given and read back; nothing about it is validated.
    function test_storesRecipePin() public {
        I.JobSpec memory s = spec(2, 4, 1);
        s.recipeHash = sha256("recipe");
        s.recipeUri = "recipes/sft.toml";
        uint256 jobId = createJob(s);
        (I.JobSpec memory got,) = bsm.getJob(jobId);
        vm.assertEq(got.recipeHash, s.recipeHash);
        vm.assertEq(got.recipeUri, s.recipeUri);
        vm.assertEq(got.seatBond, s.seatBond);
    }

    /// A zero hash (the reference node's default recipe) with an empty URI is accepted.
    function test_zeroRecipeIsTheDefault() public {
        uint256 jobId = createJob(spec(2, 4, 1));
        (I.JobSpec memory got,) = bsm.getJob(jobId);
        vm.assertEq(got.recipeHash, bytes32(0));
        vm.assertEq(bytes(got.recipeUri).length, 0);
    }
}
