"""`ncc inspect FILE.neff [--json]`: what a NEFF holds, engine by engine.

Prints the header and metadata (how it was compiled), per engine the instruction count (the
stream's entries, loops included) and how many it executes (loops expanded), the histogram of
ops, the semaphores (who updates and who waits on each, and the count they reach),
the HBM tensor table and the on-chip buffers. `--json` prints the same as one JSON document.
The NEFF is read with the packager's public reader (ncc.tools.packager.neff.read_neff).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from ncc.orchestrator.diagnostics import ExitCode, NccDiagnostic, NccError, printable, require_file
from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import loops
from ncc.tools.common.dtypes import itemsize


def _itemsize(dtype: int) -> int:
    """Bytes per element, 0 for a dtype this ncc does not know (inspect shows what a NEFF holds)."""
    try:
        return itemsize(dtype)
    except KeyError:
        return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("neff", type=Path, help="the NEFF to describe")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")


def _engine(value: int) -> str:
    return common_pb2.Engine.Name(value) if value in common_pb2.Engine.values() else f"engine{value}"


def _dtype(value: int) -> str:
    return common_pb2.DType.Name(value) if value in common_pb2.DType.values() else f"dtype{value}"


def describe(neff: bir_pb2.Neff) -> dict[str, Any]:
    """Everything `ncc inspect` shows, as plain data. A stream's `instructions` are its entries
    (static, loops included), `executed` what it runs with its loops expanded (dynamic). E502
    for a malformed loop (tools/common/loops.py)."""
    engines = []
    updated_by: dict[int, set[str]] = defaultdict(set)
    waited_by: dict[int, set[str]] = defaultdict(set)
    final_count: Counter[int] = Counter()
    for stream in neff.streams:
        name = _engine(stream.engine)
        ops = Counter(instruction.op for instruction in stream.instructions)
        runs = loops.execution_counts(stream, "E502")
        engines.append(
            {
                "engine": name,
                "instructions": len(stream.instructions),
                "executed": loops.check_stream(stream, "E502"),
                "ops": dict(sorted(ops.items(), key=lambda item: (-item[1], item[0]))),
            }
        )
        for instruction, times in zip(stream.instructions, runs, strict=True):
            for wait in instruction.waits:
                waited_by[wait.semaphore].add(name)
            for update in instruction.updates:
                updated_by[update.semaphore].add(name)
                final_count[update.semaphore] += update.increment * times
    used = sorted(set(updated_by) | set(waited_by))
    hbm = []
    for tensor in neff.hbm:
        elements = 1
        for dim in tensor.shape:
            elements *= dim
        hbm.append(
            {
                "name": tensor.name,
                "role": bir_pb2.TensorRole.Name(tensor.role)
                if tensor.role in bir_pb2.TensorRole.values()
                else "?",
                "index": tensor.index,
                "dtype": _dtype(tensor.dtype),
                "shape": list(tensor.shape),
                "bytes": elements * _itemsize(tensor.dtype),
            }
        )
    buffers = [
        {
            "name": buffer.name,
            "memory": common_pb2.Memory.Name(buffer.memory)
            if buffer.memory in common_pb2.Memory.values()
            else "?",
            "partitions": buffer.partitions,
            "bytes_per_partition": buffer.bytes_per_partition,
            "address": buffer.address,
        }
        for buffer in neff.buffers
    ]
    return {
        "name": neff.name,
        "target": neff.target,
        "format_version": neff.format_version,
        "metadata": dict(sorted(neff.metadata.items())),
        "engines": engines,
        "instructions": sum(engine["instructions"] for engine in engines),
        "executed": sum(engine["executed"] for engine in engines),
        "num_semaphores": neff.num_semaphores,
        "semaphores": [
            {
                "semaphore": sem,
                "updated_by": sorted(updated_by[sem]),
                "waited_by": sorted(waited_by[sem]),
                "final_count": final_count[sem],
            }
            for sem in used
        ],
        "hbm": hbm,
        "buffers": buffers,
    }


def _table(headers: list[str], rows: list[list[object]]) -> list[str]:
    cells = [headers, *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return [
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]


def render(info: dict[str, Any]) -> str:
    lines = [
        f"NEFF {info['name']!r}: target {info['target']}, format {info['format_version']}, "
        f"{info['instructions']} instructions ({info['executed']} executed) "
        f"on {len(info['engines'])} engines, "
        f"{info['num_semaphores']} semaphores",
        "",
        "metadata:",
        *_table(["key", "value"], [[key, value] for key, value in info["metadata"].items()]),
        "",
        "engines:",
        *_table(
            ["engine", "instructions", "executed", "ops"],
            [
                [
                    e["engine"],
                    e["instructions"],
                    e["executed"],
                    ", ".join(f"{op} {n}" for op, n in e["ops"].items()),
                ]
                for e in info["engines"]
            ],
        ),
        "",
        f"semaphores ({len(info['semaphores'])} used of {info['num_semaphores']}):",
        *_table(
            ["sem", "updated by", "waited on by", "final count"],
            [
                [
                    s["semaphore"],
                    ",".join(s["updated_by"]) or "-",
                    ",".join(s["waited_by"]) or "-",
                    s["final_count"],
                ]
                for s in info["semaphores"]
            ],
        ),
        "",
        "HBM tensors:",
        *_table(
            ["name", "role", "index", "dtype", "shape", "bytes"],
            [
                [
                    t["name"],
                    t["role"],
                    t["index"],
                    t["dtype"],
                    "x".join(map(str, t["shape"])) or "scalar",
                    t["bytes"],
                ]
                for t in info["hbm"]
            ],
        ),
        "",
        "on-chip buffers:",
        *_table(
            ["name", "memory", "partitions", "bytes/partition", "address"],
            [
                [b["name"], b["memory"], b["partitions"], b["bytes_per_partition"], b["address"]]
                for b in info["buffers"]
            ],
        ),
    ]
    return "\n".join(printable(line) for line in lines)


def run(args: argparse.Namespace) -> int:
    require_file(args.neff, "NEFF")
    from ncc.tools.common.errors import CompileError
    from ncc.tools.packager.neff import read_neff

    try:
        neff = read_neff(args.neff)
    except CompileError as err:
        raise NccError(NccDiagnostic(err.code, err.message)) from None
    try:
        info = describe(neff)
    except CompileError as err:
        raise NccError(NccDiagnostic(err.code, err.message)) from None
    print(json.dumps(info, indent=1) if args.json else render(info))
    return int(ExitCode.OK)
