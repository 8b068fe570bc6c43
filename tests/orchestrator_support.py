"""Helpers shared by the driver's tests (test_cli, test_faults, test_resume); holds no tests.

Everything runs `ncc` for real, in a fresh interpreter (`python -m ncc.orchestrator`), as a
user would; work directories are read through their files (records, history.jsonl).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def model_dirs() -> list[Path]:
    """Where the real JAX models may be: the project's copy first, then the shared folder."""
    candidates = [ROOT / "tests" / "data" / "models", ROOT / "models", ROOT.parent / "shared" / "models"]
    if os.environ.get("NCC_MODELS_DIR"):
        candidates.insert(0, Path(os.environ["NCC_MODELS_DIR"]))
    return candidates


def find_model(name: str) -> Path:
    """The path of a model file such as "add_mul.hlo"; skips the test if no copy exists."""
    for directory in model_dirs():
        if (directory / name).is_file():
            return directory / name
    pytest.skip(f"model {name} not found in {', '.join(map(str, model_dirs()))}")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        """stderr's lines but warnings (`ncc: warning: ...` accompany a result, they are not errors)."""
        return [
            line for line in self.stderr.splitlines() if line.strip() and not line.startswith("ncc: warning:")
        ]


def ncc(
    *args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> Result:
    """Run `ncc ARGS` in a new interpreter; NCC_FAULT_INJECT only if `env` sets it."""
    full_env = {key: value for key, value in os.environ.items() if key != "NCC_FAULT_INJECT"}
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "ncc.orchestrator", *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def compile_and_run(model: Path, inputs: Path, name: str, *flags: str) -> dict:
    """`ncc compile MODEL --verify FLAGS`, then `ncc run` on the `inputs` .npz, each asserted to
    succeed, the run race- and deadlock-free: its report, with its first output under "out0".
    The NEFF, outputs and report go beside `inputs`, named after `name`."""
    import numpy as np

    folder = inputs.parent
    neff, out, report = folder / f"{name}.neff", folder / f"{name}.out.npz", folder / f"{name}.json"
    compiled = ncc("compile", str(model), "--output", str(neff), "--verify", *flags, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    ran = ncc("run", str(neff), "--inputs", str(inputs), "--output", str(out), "--report", str(report),
              timeout=300)
    assert ran.returncode == 0, ran.stderr
    data = json.loads(report.read_text())
    assert data["races"] == [] and data["deadlock"] is None
    return {**data, "out0": np.load(out)["out0"]}


def assert_one_line_error(result: Result, code: str) -> str:
    """The run failed with exactly one diagnostic line whose code matches the regex `code`."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.error_lines
    assert len(lines) == 1, result.stderr
    assert re.match(rf"ncc: error: \[{code}\] ", lines[0]), lines[0]
    return lines[0]


def history(workdir: Path) -> list[dict[str, object]]:
    path = workdir / "history.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def runs_per_compile(workdir: Path) -> list[list[str]]:
    """For each compile in the work directory's history, the jobs it ran, in order."""
    compiles: list[list[str]] = []
    for event in history(workdir):
        if event["event"] == "compile_start":
            compiles.append([])
        elif event["event"] == "job_start" and compiles:
            compiles[-1].append(str(event["job"]))
    return compiles


def job_record(workdir: Path, folder: str) -> dict[str, object]:
    return json.loads((workdir / folder / "record.json").read_text())


@contextmanager
def lock_held(workdir: Path, holder_text: str) -> Iterator[None]:
    """Another process holds the work directory's lock (and wrote `holder_text` into it)."""
    code = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, sys.argv[2].encode())\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(workdir / ".ncc.lock"), holder_text], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        yield
    finally:
        holder.kill()
        holder.wait()


DEFAULT_JOB_DIRS = ["01_HLOToTensorizer", "02_Frontend", "03_WalrusDriver", "04_Packager"]


def _tiny_hbm(tensor: str):
    from ncc.schemas import bir_pb2, common_pb2

    return bir_pb2.AccessPattern(
        memory=common_pb2.HBM, tensor=tensor, dtype=common_pb2.F32, dims=[bir_pb2.Dim(stride=1, count=4)]
    )


def write_tiny_neff(path: Path, second: str) -> Path:
    """x → y by a DMA on SP, plus on ACT either a racing DMA ("race"), a wait nobody satisfies
    ("deadlock"), or ("unreset") a copy y → z that waits for the first DMA's semaphore, which is
    never reset: right once, racing in a second inference."""
    from ncc.schemas import bir_pb2, common_pb2
    from ncc.tools.packager.neff import write_neff

    neff = bir_pb2.Neff(name=path.stem, target="trn1", num_semaphores=1)
    neff.hbm.add(name="x", dtype=common_pb2.F32, shape=[4], role=bir_pb2.INPUT, index=0)
    neff.hbm.add(name="y", dtype=common_pb2.F32, shape=[4], role=bir_pb2.OUTPUT, index=0)
    sp = neff.streams.add(engine=common_pb2.SP)
    first = sp.instructions.add(
        id=1, name="a", op="dma", engine=common_pb2.SP, inputs=[_tiny_hbm("x")], outputs=[_tiny_hbm("y")]
    )
    act = neff.streams.add(engine=common_pb2.ACT)
    if second == "deadlock":
        stuck = act.instructions.add(id=2, name="b", op="nop", engine=common_pb2.ACT)
        stuck.waits.add(semaphore=0, value=1)
    else:  # a second dma on ACT: x -> y again (racing the first), or y -> z behind its semaphore
        copy = act.instructions.add(id=2, name="b", op="dma", engine=common_pb2.ACT, dma_queue=1)
        source, destination = ("y", "z") if second == "unreset" else ("x", "y")
        copy.inputs.append(_tiny_hbm(source))
        copy.outputs.append(_tiny_hbm(destination))
        if second == "unreset":
            neff.hbm.add(name="z", dtype=common_pb2.F32, shape=[4], role=bir_pb2.OUTPUT, index=1)
            first.updates.add(semaphore=0, increment=1)
            copy.waits.add(semaphore=0, value=1)
    write_neff(path, neff)
    return path
