"""Farm benchmark (`make bench` runs it after the compile benchmark): `ncc farm` over real models.

Measured side by side in one run, each REPS times (medians printed, every sample in --json):

  1 worker / 2 workers    cold farm wall (fresh farm dir, no cache), and the speedup 1w / 2w
                          (target >= 1.8 on 2 cores)
  cold / fully cached     a 2-worker farm that fills a fresh stage cache, then a farm over a new
                          farm dir with that cache, where every job is restored (target <= 5 %)
  two compiles at once    the reference for the speedup: two plain `ncc compile`s of the two
                          largest models, one after the other, over the same two run at once
                          (2.0 on two free cores; what this machine gives two processes)
  scheduler overhead      per job: (farm wall x workers - sum of the job walls) / jobs, for a
                          cold 1-worker farm with Luigi's local scheduler and with a real luigid
                          started here on 127.0.0.1

    python bench/run_farm.py [--models-dir DIR] [--reps 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIRS = (ROOT.parent / "shared" / "models", ROOT / "models")


def models_dir(given: str | None) -> Path:
    for folder in [Path(given)] if given else list(MODEL_DIRS):
        if any(folder.glob("*.hlo.pb")):
            return folder
    raise SystemExit("run_farm: no folder with *.hlo.pb models found")


def farm(inputs: Path, farm_dir: Path, *flags: str) -> tuple[float, dict]:
    """Run `ncc farm`; its wall and its report."""
    report = farm_dir.with_suffix(".report.json")
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ncc.orchestrator",
            "farm",
            str(inputs),
            "--farm-dir",
            str(farm_dir),
            "--report",
            str(report),
            "--verbose",
            "0",
            *flags,
        ],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"run_farm: ncc farm failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return wall, json.loads(report.read_text())


def job_walls(report: dict) -> list[float]:
    """Walls of the jobs that really ran (each work dir once, even if listed twice)."""
    seen, walls = set(), []
    for entry in report["models"]:
        if entry["workdir"] in seen:
            continue
        seen.add(entry["workdir"])
        walls.extend(job["wall_s"] for job in entry["jobs"] if not job["cached"])
    return walls


def overhead_per_job(wall: float, workers: int, report: dict) -> float:
    walls = job_walls(report)
    return (wall * workers - sum(walls)) / max(len(walls), 1)


def two_compiles_speedup(inputs: Path, scratch: Path) -> float:
    """Sequential over concurrent wall of two independent `ncc compile`s (no farm involved)."""
    largest = sorted(inputs.glob("*.hlo.pb"), key=lambda p: p.stat().st_size)[-2:]

    def command(model: Path, tag: str) -> list[str]:
        folder = scratch / f"{tag}-{model.stem}"
        shutil.rmtree(folder, ignore_errors=True)
        return [
            sys.executable,
            "-m",
            "ncc.orchestrator",
            "compile",
            str(model),
            "-o",
            str(folder) + ".neff",
            "--workdir",
            str(folder),
            "--verbose",
            "0",
        ]

    started = time.perf_counter()
    for model in largest:
        subprocess.run(command(model, "seq"), check=True)
    sequential = time.perf_counter() - started
    started = time.perf_counter()
    procs = [subprocess.Popen(command(model, "par")) for model in largest]
    for proc in procs:
        proc.wait()
    return sequential / (time.perf_counter() - started)


class Luigid:
    """luigid on a free loopback port, for the duration of a `with`."""

    def __enter__(self) -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.folder = Path(tempfile.mkdtemp(prefix="ncc-bench-luigid-"))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from luigi.cmdline import luigid; luigid()",
                "--address",
                "127.0.0.1",
                "--port",
                str(port),
                "--state-path",
                str(self.folder / "state.pickle"),
                "--logdir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *_: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    inputs = models_dir(args.models_dir)
    count = len(list(inputs.glob("*.hlo.pb")))
    samples: dict[str, list[float]] = {
        key: []
        for key in (
            "one_worker_s",
            "two_workers_s",
            "cold_s",
            "cached_s",
            "local_overhead_s",
            "luigid_overhead_s",
            "two_compiles_speedup",
        )
    }
    with tempfile.TemporaryDirectory(prefix="ncc-bench-farm-") as scratch:
        root = Path(scratch)
        for rep in range(args.reps):
            samples["two_compiles_speedup"].append(two_compiles_speedup(inputs, root))
            wall, report = farm(inputs, root / f"w1-{rep}", "--workers", "1")
            samples["one_worker_s"].append(wall)
            samples["local_overhead_s"].append(overhead_per_job(wall, 1, report))
            samples["two_workers_s"].append(farm(inputs, root / f"w2-{rep}", "--workers", "2")[0])
            cache = root / f"cache-{rep}"
            samples["cold_s"].append(
                farm(inputs, root / f"cold-{rep}", "--workers", "2", "--cache-dir", str(cache))[0]
            )
            wall, report = farm(inputs, root / f"cached-{rep}", "--workers", "2", "--cache-dir", str(cache))
            assert all(job["cached"] for entry in report["models"] for job in entry["jobs"])
            samples["cached_s"].append(wall)
            with Luigid() as url:
                wall, report = farm(inputs, root / f"luigid-{rep}", "--workers", "1", "--scheduler-url", url)
            samples["luigid_overhead_s"].append(overhead_per_job(wall, 1, report))
    median = {key: statistics.median(values) for key, values in samples.items()}
    print(
        f"\nncc farm over {count} models in {inputs} "
        f"(median of {args.reps}, this machine: {os.cpu_count()} cores)"
    )
    print(f"  cold, 1 worker            {median['one_worker_s']:7.2f} s")
    print(
        f"  cold, 2 workers           {median['two_workers_s']:7.2f} s   speedup "
        f"{median['one_worker_s'] / median['two_workers_s']:.2f}x (target >= 1.8x; two plain compiles at "
        f"once: {median['two_compiles_speedup']:.2f}x)"
    )
    print(f"  cold, 2 workers, caching  {median['cold_s']:7.2f} s")
    print(
        f"  fully cached, 2 workers   {median['cached_s']:7.2f} s   "
        f"{100 * median['cached_s'] / median['cold_s']:.1f} % of cold (target <= 5 %)"
    )
    print(
        f"  scheduler overhead / job  local {1000 * median['local_overhead_s']:6.0f} ms, "
        f"luigid {1000 * median['luigid_overhead_s']:6.0f} ms"
    )
    if args.json:
        args.json.write_text(json.dumps({"models": count, "samples": samples, "median": median}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
