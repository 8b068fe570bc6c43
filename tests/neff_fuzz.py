"""Seeded mutations of a real NEFF, re-encoded with a valid checksum, run through `ncc run` and
`ncc inspect` in this process (the CLI's own entry point, stdout and stderr captured).

Used by tests/test_hostile_neff.py (a thousand cases in CI) and runnable by hand for more:

    python tests/neff_fuzz.py NEFF INPUTS.npz --cases 10000 [--seed 0] [--address-space-gb 2]

Each case must end with exit 0, 1 (an E-code about the NEFF or its inputs), 2 or 5 (a race or
deadlock found in a mutated program): never an F-code, a traceback, or more than CASE_TIMEOUT_S.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ncc.orchestrator import cli
from ncc.schemas import bir_pb2
from ncc.tools.packager.neff import decode_neff, encode_neff

CASE_TIMEOUT_S = 5.0
ALLOWED_EXITS = {0, 1, 2, 5}
HOSTILE_TEXT = ["\x1b[2J", "\x1b]0;owned\x07", "\x9b31m", "a\nb", "é", "x" * 300]


def _numbers(rng: random.Random) -> int:
    return rng.choice([0, 1, -1, 2, 7, 128, 4096, 40_000, 1 << 31, 1 << 40, 10**11, -(1 << 62)])


def mutate(neff: bir_pb2.Neff, rng: random.Random) -> tuple[bytes, str]:
    """One mutant's file bytes and what was done to it."""
    mutant = bir_pb2.Neff()
    mutant.CopyFrom(neff)
    streams = [s for s in mutant.streams if s.instructions]
    how = rng.choice(
        [
            "tensor_shape",
            "dims",
            "stride",
            "count",
            "semaphores",
            "duplicate",
            "names",
            "queue",
            "payload",
            "wait",
            "buffer",
            "drop",
            "loop",
            "loop_variation",
        ]
    )
    if how == "tensor_shape" and mutant.hbm:
        tensor = rng.choice(mutant.hbm)
        tensor.shape[:] = [_numbers(rng) for _ in range(rng.choice([1, 2, 3, 60]))]
    elif how in ("dims", "stride", "count") and streams:
        instruction = rng.choice(rng.choice(streams).instructions)
        operands = [*instruction.inputs, *instruction.outputs]
        if operands:
            ap = rng.choice(operands)
            if how == "dims":
                ap.dims.extend(bir_pb2.Dim(stride=1, count=1) for _ in range(rng.choice([1, 10, 60])))
            elif ap.dims:
                dim = rng.choice(ap.dims)
                if how == "stride":
                    dim.stride = rng.choice([0, -1, _numbers(rng)])
                else:
                    dim.count = _numbers(rng)
    elif how == "semaphores":
        mutant.num_semaphores = rng.choice([0, 33, 1 << 24, 1 << 28, -5])
    elif how == "duplicate" and streams:
        stream = rng.choice(streams)
        copies = list(stream.instructions) * rng.choice([2, 50, 200])  # linear: ~0.2 ms per instruction
        del stream.instructions[:]
        stream.instructions.extend(copies)
    elif how == "names":
        text = rng.choice(HOSTILE_TEXT)
        mutant.metadata[text] = text
        mutant.name = text
        if mutant.hbm:
            rng.choice(mutant.hbm).name = text
    elif how == "queue" and streams:
        rng.choice(rng.choice(streams).instructions).dma_queue = rng.choice([-1, 16, 1 << 20, (1 << 31) - 1])
    elif how == "wait" and streams:
        rng.choice(rng.choice(streams).instructions).waits.add(
            semaphore=rng.choice([0, 1, 31]), value=_numbers(rng)
        )
    elif how == "buffer" and mutant.buffers:
        buffer = rng.choice(mutant.buffers)
        buffer.bytes_per_partition, buffer.partitions = _numbers(rng), rng.choice([0, 1, 128, 129, 1 << 30])
    elif how == "loop" and streams:  # a loop around a random range, with a hostile count or length
        stream = rng.choice(streams)
        start = rng.randrange(len(stream.instructions))
        length = rng.choice([0, -1, 1, len(stream.instructions) - start, len(stream.instructions), 10**6])
        trip = rng.choice([0, -1, 1, 2, 3, 10**12, (1 << 62) + 1])
        loop = bir_pb2.Instruction(op="loop", engine=stream.engine, trip_count=trip, body_length=length)
        stream.instructions.insert(start, loop)
        if rng.random() < 0.3:  # loops nested past the limit
            for _ in range(9):
                stream.instructions.insert(start, bir_pb2.Instruction(op="loop", trip_count=1, body_length=1))
    elif how == "loop_variation" and streams:  # variations, inside a loop of 2 or not
        stream = rng.choice(streams)
        index = rng.randrange(len(stream.instructions))
        instruction = stream.instructions[index]
        if rng.random() < 0.7:
            stream.instructions.insert(index, bir_pb2.Instruction(op="loop", trip_count=2, body_length=1))
        operands = [*instruction.inputs, *instruction.outputs]
        if operands:
            ap = rng.choice(operands)
            for _ in range(rng.choice([1, 2])):
                ap.loop.add(step=_numbers(rng), rotation=rng.choice([[], [0, _numbers(rng)], [5], [0] * 17]))
        for wait in instruction.waits:
            wait.loop_steps.extend([_numbers(rng)] * rng.choice([1, 2]))
    elif how == "drop" and streams:
        stream = rng.choice(streams)
        del stream.instructions[rng.randrange(len(stream.instructions))]
    data = encode_neff(mutant)
    if how == "payload":  # raw bytes of the payload, checksum recomputed
        header, payload = data[:40], bytearray(data[40:])
        for _ in range(rng.randint(1, 8)):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
        import hashlib
        import struct

        magic, version, _ = struct.unpack("<4sI32s", header)
        data = struct.pack("<4sI32s", magic, version, hashlib.sha256(bytes(payload)).digest()) + bytes(
            payload
        )
    return data, how


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException, so no `except Exception` in ncc can swallow it."""


def _timeout(signum: int, frame: object) -> None:
    raise CaseTimeout


def run_case(argv: list[str]) -> tuple[int, str, float]:
    """`ncc ARGV` in this process: its exit code, its output, its wall time."""
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return code, out.getvalue() + err.getvalue(), time.monotonic() - started


def fuzz(neff_path: Path, inputs: Path, cases: int, seed: int) -> Counter[str]:
    """Run `cases` mutants; raise AssertionError naming the first one that misbehaves."""
    signal.signal(signal.SIGALRM, _timeout)
    original = decode_neff(neff_path.read_bytes())
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="ncc-neff-fuzz-") as scratch:
        mutant_path, output = Path(scratch) / "m.neff", Path(scratch) / "o.npz"
        for index in range(cases):
            data, how = mutate(original, rng)
            mutant_path.write_bytes(data)
            for argv in (
                ["inspect", str(mutant_path)],
                ["run", str(mutant_path), "--inputs", str(inputs), "--output", str(output)],
            ):
                replay = f"case {index} (seed {seed}, {how}): ncc {' '.join(argv[:1])}"
                try:
                    code, text, wall = run_case(argv)
                except CaseTimeout:
                    raise AssertionError(f"{replay} ran over {CASE_TIMEOUT_S} s") from None
                assert "Traceback" not in text, f"{replay}: {text}"
                assert code in ALLOWED_EXITS, f"{replay}: exit {code}: {text.strip()[-400:]}"
                assert "\x1b" not in text and "\x9b" not in text, f"{replay} printed a control character"
                outcomes[f"{argv[0]}:{code}"] += 1
    return outcomes


def limit_address_space(gigabytes: float) -> None:
    limit = int(gigabytes * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("neff", type=Path)
    parser.add_argument("inputs", type=Path)
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--address-space-gb", type=float, default=2.0)
    args = parser.parse_args()
    limit_address_space(args.address_space_gb)
    started = time.monotonic()
    outcomes = fuzz(args.neff, args.inputs, args.cases, args.seed)
    print(f"{args.cases} mutants in {time.monotonic() - started:.0f} s: {dict(sorted(outcomes.items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
