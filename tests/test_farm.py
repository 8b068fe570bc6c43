"""`ncc farm`: many models as one Luigi task graph, with the local scheduler and with a real luigid.

Everything runs for real: `ncc farm` processes, stage tools, a `luigid` on 127.0.0.1. What
happened is read from the report, the job records and each work dir's history.jsonl.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from orchestrator_support import find_model, history, ncc

ADD_MUL_UNSUPPORTED = """HloModule bad, entry_computation_layout={(f32[128,512]{1,0})->f32[128,512]{1,0}}

ENTRY main.1 {
  x.1 = f32[128,512]{1,0} parameter(0)
  ROOT y.1 = f32[128,512]{1,0} cholesky(x.1)
}
"""


def _models(folder: Path, *names: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    copies = []
    for name in names:
        copies.append(folder / name)
        shutil.copy(find_model(name), folder / name)
    return copies


def _runs_per_job(farm_dir: Path) -> Counter[tuple[str, str]]:
    """(work dir, job) -> how many times a tool really ran for it (restored jobs do not count)."""
    runs: Counter[tuple[str, str]] = Counter()
    for workdir in (farm_dir / "work").iterdir():
        for event in history(workdir):
            if event["event"] == "job_end" and not event.get("cached"):
                runs[(workdir.name, str(event["job"]))] += 1
    return runs


def _report(path: Path) -> dict[str, dict]:
    return {Path(entry["input"]).name: entry for entry in json.loads(path.read_text())["models"]}


def test_farm_isolates_bad_inputs_and_compiles_duplicates_once(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    _models(inputs, "add_mul.hlo.pb", "gelu.hlo", "softmax.hlo.pb")
    shutil.copy(inputs / "add_mul.hlo.pb", inputs / "add_mul_copy.hlo.pb")  # same bytes, other name
    (inputs / "truncated.hlo.pb").write_bytes((inputs / "softmax.hlo.pb").read_bytes()[:40])
    (inputs / "unsupported.hlo").write_text(ADD_MUL_UNSUPPORTED)
    shutil.copy(inputs / "gelu.hlo", inputs / "crashme.hlo")
    (inputs / "crashme.hlo").write_text((inputs / "gelu.hlo").read_text() + "\n")  # other bytes
    report = tmp_path / "report.json"
    result = ncc(
        "farm",
        inputs,
        "--farm-dir",
        tmp_path / "farm",
        "--workers",
        "2",
        "--report",
        report,
        env={"NCC_FAULT_INJECT": "hlo2penguin:segv@crashme"},
    )
    assert result.returncode == 4, result.stderr  # the worst failure is a crash (F139)
    assert "Traceback" not in result.stderr + result.stdout
    models = _report(report)
    assert {name: m["status"] for name, m in models.items()} == {
        "add_mul.hlo.pb": "ok",
        "add_mul_copy.hlo.pb": "ok",
        "gelu.hlo": "ok",
        "softmax.hlo.pb": "ok",
        "truncated.hlo.pb": "failed",
        "unsupported.hlo": "failed",
        "crashme.hlo": "failed",
    }
    assert models["truncated.hlo.pb"]["code"].startswith("E1")
    assert models["unsupported.hlo"]["code"] == "E201"
    assert models["crashme.hlo"]["code"] == "F139"
    assert "cholesky" in models["unsupported.hlo"]["message"]
    assert models["add_mul.hlo.pb"]["workdir"] == models["add_mul_copy.hlo.pb"]["workdir"]
    for name in ("add_mul.hlo.pb", "gelu.hlo", "softmax.hlo.pb"):
        entry = models[name]
        assert Path(entry["neff"]).is_file()
        assert [job["name"] for job in entry["jobs"]] == [
            "HLOToTensorizer",
            "Frontend",
            "WalrusDriver",
            "Packager",
        ]
        assert all(
            job["wall_s"] > 0 and job["peak_rss_mb"] > 0 and not job["cached"] for job in entry["jobs"]
        )
    assert max(_runs_per_job(tmp_path / "farm").values()) == 1
    # Two workers: each tool gets half the cores for numpy's thread pools (unless already set).
    tool_env = json.loads((Path(models["gelu.hlo"]["workdir"]) / "run_settings.json").read_text())["env"]
    share = str(max(1, (os.cpu_count() or 1) // 2))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        assert tool_env[name] == os.environ.get(name, share)
    run = ncc(
        "run",
        models["gelu.hlo"]["neff"],
        "--inputs",
        find_model("gelu.io.npz"),
        "--output",
        tmp_path / "o.npz",
    )
    assert run.returncode == 0, run.stderr


def test_a_second_farm_with_the_same_cache_runs_no_tool(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    _models(inputs, "add_mul.hlo.pb", "matmul.hlo.pb")
    cache = tmp_path / "cache"
    first = ncc("farm", inputs, "--farm-dir", tmp_path / "farm1", "--cache-dir", cache, "--workers", "2")
    assert first.returncode == 0, first.stderr
    report = tmp_path / "r.json"
    second = ncc("farm", inputs, "--farm-dir", tmp_path / "farm2", "--cache-dir", cache, "--report", report)
    assert second.returncode == 0, second.stderr
    assert all(job["cached"] for m in _report(report).values() for job in m["jobs"])
    assert not _runs_per_job(tmp_path / "farm2")
    rows = [line.split() for line in second.stdout.splitlines() if line.startswith(("add_mul", "matmul"))]
    assert [row[3:5] for row in rows] == [["4/4", "0/4"]] * 2  # restored from the cache, not reused
    neffs = sorted((tmp_path / "farm1" / "neff").iterdir())
    assert [p.read_bytes() for p in neffs] == [
        p.read_bytes() for p in sorted((tmp_path / "farm2" / "neff").iterdir())
    ]

    # One flipped byte in matmul's cached BIR: a third farm finds it, recomputes that job only
    # (the jobs after it hit again: the recomputed BIR has the same digest) and reports it.
    bir = next(cache.glob("entries/*/*/bir.pb"))
    data = bytearray(bir.read_bytes())
    data[len(data) // 2] ^= 0x04
    bir.write_bytes(bytes(data))
    third = ncc("farm", inputs, "--farm-dir", tmp_path / "farm3", "--cache-dir", cache, "--report", report)
    assert third.returncode == 0, third.stderr
    assert "1 corrupt entries discarded and recomputed" in third.stdout
    lookups = {name: [job["cache_lookup"] for job in m["jobs"]] for name, m in _report(report).items()}
    corrupted = [name for name, jobs in lookups.items() if "corrupt" in jobs]
    assert len(corrupted) == 1 and lookups[corrupted[0]] == ["hit", "corrupt", "hit", "hit"]
    assert sum(runs for runs in _runs_per_job(tmp_path / "farm3").values()) == 1


def test_the_largest_model_starts_first(tmp_path: Path) -> None:
    """Largest first (Luigi priority = input size): the last job left running is a small one."""
    inputs = tmp_path / "in"
    small, large = _models(inputs, "add_mul.hlo.pb", "softmax.hlo.pb")
    assert small.stat().st_size < large.stat().st_size
    result = ncc("farm", inputs, "--farm-dir", tmp_path / "farm", "--workers", "1")
    assert result.returncode == 0, result.stderr
    starts = {}
    for workdir in (tmp_path / "farm" / "work").iterdir():
        first = next(event for event in history(workdir) if event["event"] == "job_start")
        model = next((workdir.parent.parent / "inputs" / workdir.name.split("-")[0]).iterdir())
        starts[model.name] = first["time"]
    assert starts["softmax.hlo.pb"] < starts["add_mul.hlo.pb"]


def test_bad_farm_command_lines_are_one_line_errors(tmp_path: Path) -> None:
    missing = ncc("farm", tmp_path / "nope.hlo.pb", "--farm-dir", tmp_path / "f")
    assert missing.returncode == 2 and "[U001]" in missing.stderr
    manifest = tmp_path / "list.txt"
    manifest.write_text(f"{find_model('add_mul.hlo.pb')} --optlevel 9\n")
    bad_flag = ncc("farm", manifest, "--farm-dir", tmp_path / "f")
    assert bad_flag.returncode == 2 and "[U002]" in bad_flag.stderr and "Traceback" not in bad_flag.stderr
    too_big = ncc(
        "farm", find_model("add_mul.hlo.pb"), "--farm-dir", tmp_path / "f", "--mem-per-job", "99999999"
    )
    assert (
        too_big.returncode == 2 and "[U002]" in too_big.stderr and "no job could ever start" in too_big.stderr
    )
    negative = ncc("farm", find_model("add_mul.hlo.pb"), "--farm-dir", tmp_path / "f", "--retries", "-1")
    assert negative.returncode == 2 and "'-1' must not be negative" in negative.stderr
    prose = tmp_path / "notes.txt"  # not a model, so read as a manifest: the message says so
    prose.write_text("hello world\n")
    not_a_manifest = ncc("farm", prose, "--farm-dir", tmp_path / "f")
    assert not_a_manifest.returncode == 2 and "[U001]" in not_a_manifest.stderr
    assert f"manifest {prose} line 1: model file not found" in not_a_manifest.stderr
    assert not (tmp_path / "f").exists()  # a refused farm leaves no farm dir behind


def test_a_manifest_sets_flags_per_model_and_memory_is_reserved_per_job(tmp_path: Path) -> None:
    model = find_model("add_mul.hlo.pb")
    manifest = tmp_path / "list.txt"
    manifest.write_text(f"# two compiles of one model\n{model} -O0\n{model} --optlevel 2\n")
    report = tmp_path / "r.json"
    result = ncc("farm", manifest, "--farm-dir", tmp_path / "f", "--mem-per-job", "512", "--report", report)
    assert result.returncode == 0, result.stderr
    entries = json.loads(report.read_text())["models"]
    assert sorted(tuple(e["flags"]) for e in entries) == [("--optlevel=0",), ("--optlevel=2",)]
    assert len({e["workdir"] for e in entries}) == 2 and len({e["neff"] for e in entries}) == 2


# -- luigid -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Luigid:
    """A real luigid on 127.0.0.1 with its own state file, config and log folder."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = folder / "luigi.cfg"
        self.config.write_text(
            "[scheduler]\nretry_delay = 1\nworker_disconnect_delay = 4\nprune_on_get_work = true\n"
            f"state_path = {folder / 'state.pickle'}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "LUIGI_CONFIG_PATH": str(self.config)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from luigi.cmdline import luigid; luigid()",
                "--address",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--state-path",
                str(self.folder / "state.pickle"),
                "--logdir",
                str(self.folder),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.folder / "luigid.err", "wb"),  # noqa: SIM115 (lives as long as the process)
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("luigid did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)  # luigid saves its state file on SIGTERM
            self.proc.wait(timeout=30)
            self.proc = None


def _farm_worker(
    inputs: list[Path], farm_dir: Path, url: str, cwd: Path, *extra: str
) -> subprocess.Popen[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "NCC_FAULT_INJECT"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ncc.orchestrator",
            "farm",
            *map(str, inputs),
            "--farm-dir",
            str(farm_dir),
            "--scheduler-url",
            url,
            "--report",
            str(cwd / "report.json"),
            *extra,
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _all_shared_models(folder: Path) -> list[Path]:
    names = [p.name for p in find_model("add_mul.hlo.pb").parent.glob("*.hlo.pb")]
    copies = _models(folder, *sorted(names))
    duplicate = folder / "dup"
    duplicate.mkdir()
    for path in copies[:3]:
        shutil.copy(path, duplicate / f"again_{path.name}")
    return [folder, *sorted(duplicate.iterdir())]


@pytest.mark.slow
def test_two_workers_on_luigid_compile_every_model_once_and_survive_a_scheduler_restart(
    tmp_path: Path,
) -> None:
    scheduler = Luigid(tmp_path / "luigid")
    scheduler.start()
    try:
        inputs = _all_shared_models(tmp_path / "models")
        farm_dir = tmp_path / "farm"
        workers = [_farm_worker(inputs, farm_dir, scheduler.url, tmp_path / f"root{i}") for i in range(2)]
        time.sleep(4)
        scheduler.stop()  # restart luigid mid-farm: workers retry their RPCs; finished work is on disk
        scheduler.start()
        outputs = [w.communicate(timeout=600) for w in workers]
    finally:
        scheduler.stop()
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0 and "Traceback" not in out + err, out + err
    runs = _runs_per_job(farm_dir)
    models = len(list((farm_dir / "work").iterdir()))
    assert models == len(list(find_model("add_mul.hlo.pb").parent.glob("*.hlo.pb")))
    assert sum(runs.values()) == 4 * models and max(runs.values()) == 1, runs  # every job ran, once
    reports = [
        _report(tmp_path / f"root{i}" / "report.json")
        for i in range(2)
        if (tmp_path / f"root{i}" / "report.json").exists()
    ]
    assert reports and all(entry["status"] == "ok" for report in reports for entry in report.values())


def _tool_processes(farm_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if "ncc.tools." in cmdline and str(farm_dir) in str(proc.info["cwd"] or ""):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
def test_a_worker_killed_mid_farm_leaves_the_rest_to_the_other_and_no_orphan(tmp_path: Path) -> None:
    scheduler = Luigid(tmp_path / "luigid")
    scheduler.start()
    try:
        inputs = _all_shared_models(tmp_path / "models")
        farm_dir = tmp_path / "farm"
        victim = _farm_worker(
            inputs, farm_dir, scheduler.url, tmp_path / "victim", "--workers", "2", "--retries", "3"
        )
        deadline = time.monotonic() + 60
        while not _tool_processes(farm_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        survivor = _farm_worker(inputs, farm_dir, scheduler.url, tmp_path / "survivor", "--retries", "3")
        victim.send_signal(signal.SIGKILL)
        victim.communicate()
        out, err = survivor.communicate(timeout=600)
    finally:
        scheduler.stop()
    assert survivor.returncode == 0, err
    assert not _tool_processes(farm_dir)
    report = _report(tmp_path / "survivor" / "report.json")
    assert all(entry["status"] == "ok" for entry in report.values())
