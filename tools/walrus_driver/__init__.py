"""walrus_driver: the backend. One process runs a named list of passes over a BIR program.

Input: the frontend's BIR (one valid global order of instructions, virtual on-chip buffers, dmas on
SP queue 0, no semaphores). Output: the same program with addresses, DMA queues and trigger
engines chosen, semaphore waits/updates inserted and per-engine streams, such that the simulator
runs it race- and deadlock-free and it computes what the input order computes sequentially.

The pass machinery, at the top:
  registry.py       pass name -> PassInfo (@register in each pass module), did-you-mean for typos
  pass_manager.py   pipeline text "a,b{k=v},c", DEFAULT_PASSES / default_pipeline(optlevel),
                    instruments (--print-ir-after, --timing, --verify-each, --stats)
  context.py        PassContext: program, target, dependence graph, state flags (E402 checks)
  printer.py        the text IR; op_patterns.py: the op= patterns of fault injection
  miscompile.py     planted miscompiles (test-only, NCC_FAULT_INJECT=walrus_driver:max_to_add@pass=P)
  __main__.py       the ncc-walrus-driver command line
passes/             one module per pass (see `ncc-walrus-driver --list-passes`)
analysis/           the models of the program and the machine that several passes share:
  birutil.py        op tables, operand footprints; costs.py the cost model and lower bound;
  depgraph.py       the dependence graph; syncmodel.py threads and vector clocks (alloc_semaphores
                    and birverifier); engine_choice.py the exact ACT forms of DVE instructions

Default pipeline (optlevel 1-3; optlevel 0 drops split_dma, dep_reduction and pre_sched):
  split_dma, anti_dependency_analyzer, dep_reduction, assign_hwdge_engine, pre_sched,
  allocation, anti_dependency_analyzer, alloc_semaphores, sync_dve_pool, semaphore_reset,
  lower_sync, birverifier, codegen, roll_loops
(bir_sim can be appended to execute the result in the simulator.)
Diagnostics: E400 bad option/target, E401 unknown pass, E402 missing prerequisite, E403 out of
on-chip memory, E404 out of semaphores, E405 malformed input, E410 verifier, E411 race/deadlock in
simulation, E412 simulated result differs from sequential execution (or, bir_sim{golden=...},
from the golden outputs).
"""
