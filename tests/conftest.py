"""Shared fixtures: where the bundled real JAX models are, and how to run the ncc CLI for real.

bench/ goes on sys.path so that tests generate HLO with the benchmark's own generator (hlo_gen).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from orchestrator_support import ROOT
from orchestrator_support import ncc as run_ncc  # noqa: F401  (the one way tests run the real CLI)

MODELS_DIR = Path(os.environ.get("NCC_MODELS_DIR", ROOT / "models"))
sys.path.insert(0, str(ROOT / "bench"))


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return MODELS_DIR
