"""Shared fixtures: where the bundled real JAX models are, and how to run the ncc CLI for real."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from orchestrator_support import ROOT
from orchestrator_support import ncc as run_ncc  # noqa: F401  (the one way tests run the real CLI)

MODELS_DIR = Path(os.environ.get("NCC_MODELS_DIR", ROOT / "models"))


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return MODELS_DIR
