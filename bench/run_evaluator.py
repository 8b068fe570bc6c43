"""Time the golden evaluator alone on HLO modules: what the GoldenEvaluator job spends in numpy.

For each file: parse the HLO text (or read the proto), make the seeded inputs the job makes, and
evaluate, REPS times; print the median wall of the evaluation and of the whole (parse, inputs,
evaluation), and the module's largest array.

    python bench/run_evaluator.py tests/data/slow_classes/int_1m.hlo [more.hlo ...] [--reps 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

from ncc.tools.hlo.hlo_reader import load_module
from ncc.tools.hlo.hlo_types import dims, entry_computation, leaf_shapes
from ncc.tools.hlo_opt.golden.evaluator import evaluate, make_inputs


def time_module(path: Path, reps: int) -> tuple[float, float, int]:
    """(median evaluation wall, median whole wall, largest array's elements) of `path`."""
    evaluation, whole = [], []
    largest = 0
    for _ in range(reps):
        start = time.perf_counter()
        module = load_module(str(path))
        inputs = make_inputs(module, 0)
        middle = time.perf_counter()
        evaluate(module, inputs)
        end = time.perf_counter()
        evaluation.append(end - middle)
        whole.append(end - start)
        largest = max(math.prod(dims(leaf)) for instr in entry_computation(module).instructions
                      for leaf in leaf_shapes(instr.shape))
    return statistics.median(evaluation), statistics.median(whole), largest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+", type=Path)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'module':40s} {'largest array':>14s} {'evaluate':>10s} {'with parse + inputs':>20s}")
    for path in args.modules:
        evaluation, whole, largest = time_module(path, args.reps)
        print(f"{path.name:40s} {largest:14,d} {evaluation:9.2f}s {whole:19.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
