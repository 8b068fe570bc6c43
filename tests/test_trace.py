"""`ncc run --trace`: the simulated schedule as a Chrome Trace Event Format file (Perfetto)."""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from orchestrator_support import assert_one_line_error, find_model, ncc, write_tiny_neff
from test_sim import elementwise_inputs, elementwise_program

from ncc.tools.sim.api import chrome_trace, simulate_program

ENGINE_NAMES = {"PE", "ACT", "POOL", "DVE", "SP"}


def x_events(trace: dict) -> list[dict]:
    return [event for event in trace["traceEvents"] if event["ph"] == "X"]


def track_names(trace: dict) -> dict[int, str]:
    return {
        event["tid"]: event["args"]["name"]
        for event in trace["traceEvents"]
        if event["ph"] == "M" and event["name"] == "thread_name"
    }


_RUNS: dict[str, dict] = {}


def run_traced(name: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A bundled model compiled and run with --trace and --report, once per session: {trace,
    report, neff, io}."""
    if name not in _RUNS:
        model, io = find_model(f"{name}.hlo.pb"), find_model(f"{name}.io.npz")
        folder = tmp_path_factory.mktemp(f"trace_{name}")
        neff = folder / f"{name}.neff"
        done = ncc("compile", model, "--output", neff, "--workdir", folder / "w")
        assert done.returncode == 0, done.stderr
        trace, report = folder / "trace.json", folder / "report.json"
        flags = ["--output", folder / "out.npz", "--report", report, "--trace", trace]
        done = ncc("run", neff, "--inputs", io, *flags)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr and str(trace) in done.stdout
        assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
        _RUNS[name] = {
            "trace": json.loads(trace.read_text()),
            "report": json.loads(report.read_text()),
            "neff": neff,
            "io": io,
        }
    return _RUNS[name]


@pytest.fixture(params=["softmax", "matmul"])  # ACT/DVE/SP and PE/ACT/SP, both wait across engines
def traced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_traced(request.param, tmp_path_factory)


@pytest.mark.slow
def test_trace_is_valid_trace_event_format(traced: dict) -> None:
    trace = traced["trace"]
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    for event in trace["traceEvents"]:
        assert event["ph"] in ("X", "M"), event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "X":
            for key in ("name", "ph", "ts", "dur", "pid", "tid"):
                assert key in event, (key, event)
            assert event["ts"] >= 0 and event["dur"] >= 0
    process = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert [e["args"]["name"] for e in process] == ["ncc sim"]


@pytest.mark.slow
def test_a_named_track_per_engine_and_queue_used(traced: dict) -> None:
    trace, report = traced["trace"], traced["report"]
    names = track_names(traced["trace"])
    assert len(set(names.values())) == len(names)  # one track per name
    assert {e["tid"] for e in x_events(trace)} <= set(names)  # every event sits on a named track
    engines = {e["args"]["engine"] for e in x_events(trace) if e["cat"] == "instruction"}
    queues = {e["args"]["queue"] for e in x_events(trace) if e["cat"] == "dma_transfer"}
    assert engines == {
        name for name, busy in report["engine_busy_ns"].items() if name in ENGINE_NAMES and busy
    }
    assert queues == {name for name in report["engine_busy_ns"] if name not in ENGINE_NAMES} and queues
    assert set(names.values()) == engines | {f"DMA {queue}" for queue in queues}
    for event in x_events(trace):  # and each event (instruction, stall, transfer) is on its owner's track
        args = event["args"]
        owner = f"DMA {args['queue']}" if event["cat"] == "dma_transfer" else args["engine"]
        assert names[event["tid"]] == owner, event


@pytest.mark.slow
def test_one_event_per_instruction_with_its_sync(traced: dict) -> None:
    instructions = [e for e in x_events(traced["trace"]) if e["cat"] == "instruction"]
    assert len(instructions) == traced["report"]["instruction_count"]
    assert len({e["args"]["id"] for e in instructions}) == len(instructions)
    for event in instructions:
        assert {"id", "op", "engine", "waits", "updates"} <= set(event["args"]), event
    dmas = {e["args"]["id"] for e in instructions if e["args"]["op"] == "dma"}
    transfers = [e["args"]["id"] for e in x_events(traced["trace"]) if e["cat"] == "dma_transfer"]
    assert sorted(transfers) == sorted(dmas) and dmas


@pytest.mark.slow
def test_no_two_slices_overlap_on_a_track(traced: dict) -> None:
    by_track: dict[int, list[dict]] = defaultdict(list)
    for event in x_events(traced["trace"]):
        by_track[event["tid"]].append(event)
    for events in by_track.values():
        events.sort(key=lambda e: (e["ts"], e["dur"]))
        for before, after in pairwise(events):
            assert before["ts"] + before["dur"] <= after["ts"] + 1e-5, (before, after)


@pytest.mark.slow
def test_the_last_slice_ends_at_the_simulated_time(traced: dict) -> None:
    end = max(e["ts"] + e["dur"] for e in x_events(traced["trace"]))
    assert end == pytest.approx(traced["report"]["simulated_ns"] / 1000, abs=1e-5)


@pytest.mark.slow
def test_semaphore_stalls_are_wait_slices(traced: dict) -> None:
    events = x_events(traced["trace"])
    waits = [e for e in events if e["cat"] == "semaphore_wait"]
    assert waits and all(e["name"] == "wait" and e["dur"] > 0 and e["args"]["waits"] for e in waits)
    starts = {(e["tid"], e["args"]["id"]): e["ts"] for e in events if e["cat"] == "instruction"}
    for wait in waits:  # a stall ends no later than its instruction starts, on the same track
        assert wait["ts"] + wait["dur"] <= starts[(wait["tid"], wait["args"]["id"])] + 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "code"),
    [("directory", "U002"), ("/proc/ncc-trace.json", "U005"), ("missing/t.json", "U004"), ("output", "U002")],
)
def test_a_bad_trace_path_is_one_line_and_writes_nothing(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, where: str, code: str
) -> None:
    traced = run_traced("softmax", tmp_path_factory)
    out = tmp_path / "out.npz"
    trace = {"directory": tmp_path, "output": out}.get(where) or (
        Path(where) if where.startswith("/") else tmp_path / where
    )
    done = ncc("run", traced["neff"], "--inputs", traced["io"], "--output", out, "--trace", trace)
    line = assert_one_line_error(done, code)
    assert done.returncode != 0 and str(trace) in line
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.is_file()]


def test_a_deadlocked_run_still_writes_its_trace_with_the_stuck_wait(tmp_path: Path) -> None:
    neff = write_tiny_neff(tmp_path / "dead.neff", "deadlock")
    inputs, trace = tmp_path / "in.npz", tmp_path / "t.json"
    np.savez(inputs, arg0=np.arange(4, dtype=np.float32))
    done = ncc("run", neff, "--inputs", inputs, "--output", tmp_path / "out.npz", "--trace", trace)
    assert_one_line_error(done, "R002")
    events = x_events(json.loads(trace.read_text()))
    assert [e["args"]["id"] for e in events if e["cat"] == "instruction"] == [1]
    [stuck] = [e for e in events if e["cat"] == "semaphore_wait"]
    assert stuck["args"]["id"] == 2 and stuck["args"]["deadlock"] is True
    assert stuck["ts"] == 0 and stuck["ts"] + stuck["dur"] == max(e["ts"] + e["dur"] for e in events)


def test_recording_is_off_by_default_and_changes_nothing() -> None:
    plain = simulate_program(elementwise_program(), elementwise_inputs())
    recorded = simulate_program(elementwise_program(), elementwise_inputs(), record_schedule=True)
    assert plain.schedule is None and recorded.schedule is not None
    assert recorded.report() == plain.report()
    for name, array in plain.outputs.items():
        np.testing.assert_array_equal(recorded.outputs[name], array)
    trace = chrome_trace(recorded.schedule)
    assert sum(e["cat"] == "instruction" for e in x_events(trace)) == plain.instruction_count
