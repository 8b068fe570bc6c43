"""NEFFs with a valid checksum and hostile contents: every size and count is checked before the
simulator allocates or runs anything, and `ncc inspect` never prints a control character
(issue 8, case 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from orchestrator_support import ROOT, assert_one_line_error, find_model, ncc

from ncc.schemas import bir_pb2
from ncc.tools.packager.neff import decode_neff, encode_neff


@pytest.fixture(scope="module")
def neff_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hostile")
    result = ncc("compile", find_model("add_mul.hlo.pb"), "-o", folder / "m.neff")
    assert result.returncode == 0, result.stderr
    return folder / "m.neff"


def _variant(neff_path: Path, tmp_path: Path, edit) -> Path:
    neff = decode_neff(neff_path.read_bytes())
    edit(neff)
    path = tmp_path / "hostile.neff"
    path.write_bytes(encode_neff(neff))
    return path


def _output(neff: bir_pb2.Neff) -> bir_pb2.HbmTensor:
    return next(t for t in neff.hbm if t.role == bir_pb2.OUTPUT)


def _first_operand(neff: bir_pb2.Neff) -> bir_pb2.AccessPattern:
    return next(i for s in neff.streams for i in s.instructions if i.inputs).inputs[0]


def _run(path: Path, tmp_path: Path, **env: str):
    return ncc(
        "run", path, "--inputs", find_model("add_mul.io.npz"), "--output", tmp_path / "o.npz", env=env or None
    )


def _shape(shape: list[int]):
    return lambda neff: _output(neff).shape.__setitem__(slice(None), shape)


def _dims(count: int):
    return lambda neff: _first_operand(neff).dims.extend(bir_pb2.Dim(stride=1, count=1) for _ in range(count))


def _zero_stride(neff: bir_pb2.Neff) -> None:
    _first_operand(neff).dims.add(stride=0, count=1 << 40)


def _semaphores(neff: bir_pb2.Neff) -> None:
    neff.num_semaphores = 1 << 24


@pytest.mark.parametrize(
    ("edit", "code", "words"),
    [
        (_shape([40000, 40000]), "E604", "this host allows 1,000,000,000"),
        (_shape([10**11, 10**11]), "E603", "needs 40,000,000,000,000,000,000,000 bytes"),  # not wrapped
        (_dims(60), "E603", "dimensions (at most 8)"),
        (_zero_stride, "E604", "spans"),
        (_semaphores, "E603", "16777216 semaphores"),
    ],
)
def test_hostile_sizes_are_refused_before_allocation(
    neff_path: Path, tmp_path: Path, edit, code, words
) -> None:
    path = _variant(neff_path, tmp_path, edit)
    result = _run(path, tmp_path, NCC_SIM_MAX_BYTES=str(10**9))
    line = assert_one_line_error(result, code)
    assert result.returncode == 1 and words in line


def test_inspect_escapes_control_characters(neff_path: Path, tmp_path: Path) -> None:
    def edit(neff: bir_pb2.Neff) -> None:
        neff.metadata["\x1b]0;owned\x07"] = "\x1b[2J\x9b31m"
        neff.name = "name\x1b[5m"

    result = ncc("inspect", _variant(neff_path, tmp_path, edit))
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x9b" not in result.stdout and "\x07" not in result.stdout
    assert "\\x1b[2J" in result.stdout


@pytest.mark.slow
@pytest.mark.sweep
def test_neff_mutations_under_a_2gb_address_space(neff_path: Path) -> None:
    """Seeded mutants (tests/neff_fuzz.py) through `ncc run` and `ncc inspect`, limited to 2 GB of
    address space: no traceback, no F-code, none over 5 s. `python tests/neff_fuzz.py` runs more."""
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "neff_fuzz.py"),
            str(neff_path),
            str(find_model("add_mul.io.npz")),
            "--cases",
            "300",
            "--seed",
            "1",
            "--address-space-gb",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "300 mutants" in result.stdout
