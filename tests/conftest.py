"""Shared fixtures: where the bundled real JAX models are, and how to run the ncc CLI for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = Path(os.environ.get("NCC_MODELS_DIR", ROOT / "models"))


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return MODELS_DIR


def run_ncc(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run the real `ncc` CLI in a fresh interpreter, as a user would."""
    full_env = dict(os.environ)
    full_env.pop("NCC_FAULT_INJECT", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ncc.orchestrator.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
