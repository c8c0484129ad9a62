// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IDistributedTrainingBSM} from "../../src/interfaces/IDistributedTrainingBSM.sol";
import {IBlueprintServiceManager} from "../../src/interfaces/IBlueprintServiceManager.sol";

/// Everything the BSM exposes. Tests talk to the deployed contract through this interface and
/// deploy it from its artifact, so they compile without the IR pipeline the BSM needs.
interface IBSM is IDistributedTrainingBSM, IBlueprintServiceManager {}
