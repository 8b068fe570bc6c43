"""The simulator: executes BIR or a NEFF with numpy values, discrete-event timing, race and
deadlock detection. Public API in api.py (re-exported here); CLI in __main__.py (`ncc-sim`).

Modules: memory (device memory, access patterns), instruction (decoded op), semantics (what ops
compute), timing (cost model), program (loading streams; loops decoded once, not expanded), hb
(happens-before, races), deadlock (wait-for graph), simulator (event loop), effects (where the
functional effects land: in this process, or for a long run in a child on the other core), api
(public entry points), check (outputs against expected ones: the tolerance rule of --verify).
"""

from ncc.tools.sim.api import Race, SimResult, simulate_neff, simulate_program

__all__ = ["Race", "SimResult", "simulate_neff", "simulate_program"]
