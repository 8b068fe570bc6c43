"""The simulator: executes BIR or a NEFF with numpy values, discrete-event timing, race and
deadlock detection. Public API in api.py (re-exported here); CLI in __main__.py (`ncc-sim`).

Modules: memory (device memory, access patterns), instruction (decoded op), semantics (what ops
compute), timing (cost model), program (loading streams), hb (happens-before, races), deadlock
(wait-for graph), simulator (event loop), api (public entry points), check (outputs against
expected ones: the tolerance rule of --verify).
"""

from ncc.tools.sim.api import Race, SimResult, simulate_neff, simulate_program

__all__ = ["Race", "SimResult", "simulate_neff", "simulate_program"]
