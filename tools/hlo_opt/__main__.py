"""ncc-hlo-opt: the golden evaluator (--evaluate, job GoldenEvaluator) and Penguin → BIR (job Frontend).

Before lowering to BIR, the Frontend optimizes the Penguin program (optimizer.py) at --optlevel 1
and above: loop fusion, common loads, dead code, then software pipelining of the loops that ask for
it (--penguin-passes picks others; --num-stages N asks it of every eligible loop). At 0 it lowers
the program as written.
"""

from __future__ import annotations

import argparse

from ncc.tools.common.protoio import write_proto
from ncc.tools.common.toolmain import exit_now, run_tool


def _body(args: argparse.Namespace) -> None:
    if args.evaluate:
        from ncc.tools.hlo_opt.golden.run import run_golden

        run_golden(args.input, args.output, args.seed, args.inputs)
        return
    from ncc.schemas import penguin_pb2
    from ncc.tools.common.protoio import read_proto
    from ncc.tools.hlo_opt.bir_codegen import lower_to_bir
    from ncc.tools.hlo_opt.optimizer import optimize, pass_list

    program = read_proto(args.input, penguin_pb2.Program, "Penguin program")
    optimize(program, pass_list(args.penguin_passes, args.optlevel), num_stages=args.num_stages)
    write_proto(args.output, lower_to_bir(program, args.target, args.loops))


def main() -> None:
    parser = argparse.ArgumentParser(prog="ncc-hlo-opt", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--input", required=True, help="Penguin program, or with --evaluate an HloModuleProto"
    )
    parser.add_argument("--output", required=True, help="BIR program, or with --evaluate a TensorSet")
    parser.add_argument("--evaluate", action="store_true", help="run the golden HLO evaluator")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (--evaluate)")
    parser.add_argument("--inputs", help="inputs instead of generated ones (--evaluate): a TensorSet, or an "
                        ".npz of arg0..argN")
    parser.add_argument("--target", default="trn1")
    parser.add_argument("--optlevel", type=int, choices=range(4), default=2,
                        help="0 lowers the Penguin program as written; 1-3 run the Penguin optimizer")
    parser.add_argument("--penguin-passes", default="", metavar="a,b,...",
                        help="the Penguin passes to run, in order ('none' for none); overrides --optlevel's")
    parser.add_argument("--num-stages", type=int, default=0, metavar="N",
                        help="software-pipeline every eligible loop in N stages (where the pipeline pass "
                        "runs; annotated loops keep their own count; 0 or 1: only annotated loops)")
    parser.add_argument("--loops", choices=("auto", "rolled", "unrolled"), default="auto",
                        help="keep the loops that can stay loops rolled in BIR (rolled), unroll every "
                        "loop (unrolled), or roll only a program too large to unroll cheaply (auto)")
    exit_now(run_tool("hlo_opt", parser, _body))


if __name__ == "__main__":
    main()
