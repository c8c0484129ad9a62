"""The end-to-end tests use the devnet's cluster harness (scripts/devnet.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ETH = 10**18

_spec = importlib.util.spec_from_file_location("devnet", ROOT / "scripts" / "devnet.py")
devnet = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["devnet"] = devnet  # dataclasses look their module up while the class is built
_spec.loader.exec_module(devnet)  # type: ignore[union-attr]
Cluster = devnet.Cluster
