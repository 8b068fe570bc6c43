"""hlo_opt: the Frontend and GoldenEvaluator jobs' tool (`ncc-hlo-opt`).

    __main__.py     the command line: `--evaluate` (golden outputs) or optimize + lower (bir.pb)
    golden/         the golden evaluator, a tool of its own: numpy semantics of every HLO op
                    (evaluator.py) and the GoldenEvaluator job's body (run.py)
    optimizer.py    the Penguin pass manager: `--penguin-passes`, the -O1+ default list
    passes/         one module per Penguin pass (fusion, cse, act_functions, broadcast_operands, dce, retile,
                    tile_order, epilogues, pipelining, invariant_loads, forwarding, direct_copies,
                    act_operands)
    dependences.py  islpy dependence checks shared by tile_order and pipelining
    nonfinite.py    which tensors may hold ±inf or NaN by construction (read by forwarding)
    bir_codegen.py  BirCodeGenLoop: Penguin → BIR (unrolled engine instructions)
"""
