"""ncc-hlo-opt: the golden evaluator (--evaluate, job GoldenEvaluator) and Penguin → BIR (job Frontend).

Penguin optimization passes are not written yet (see README "Not yet"); the frontend lowers the
Penguin program as hlo2penguin wrote it.
"""

from __future__ import annotations

import argparse
import sys

from ncc.tools.common.protoio import write_proto
from ncc.tools.common.toolmain import run_tool


def _body(args: argparse.Namespace) -> None:
    if args.evaluate:
        from ncc.tools.hlo_opt.golden import run_golden

        run_golden(args.input, args.output, args.seed, args.inputs)
        return
    from ncc.schemas import penguin_pb2
    from ncc.tools.common.protoio import read_proto
    from ncc.tools.hlo_opt.bir_codegen import lower_to_bir

    program = read_proto(args.input, penguin_pb2.Program, "Penguin program")
    write_proto(args.output, lower_to_bir(program, args.target))


def main() -> None:
    parser = argparse.ArgumentParser(prog="ncc-hlo-opt", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--input", required=True, help="Penguin program, or with --evaluate an HloModuleProto"
    )
    parser.add_argument("--output", required=True, help="BIR program, or with --evaluate a TensorSet")
    parser.add_argument("--evaluate", action="store_true", help="run the golden HLO evaluator")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (--evaluate)")
    parser.add_argument("--inputs", help="TensorSet of inputs instead of generated ones (--evaluate)")
    parser.add_argument("--target", default="trn1")
    sys.exit(run_tool("hlo_opt", parser, _body))


if __name__ == "__main__":
    main()
