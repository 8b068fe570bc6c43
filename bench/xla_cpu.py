"""XLA:CPU's compile time of a JAX function, the yardstick every benchmark prints beside ncc's.

Only compile() is timed. Each rep wraps the function in a new function object and clears JAX's
in-memory caches first (the persistent cache is off), so each rep is a full XLA compile; the
process's first call compiles once untimed, which keeps XLA's one-time start-up out. Needs JAX.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

_started: list[bool] = []  # non-empty once this process has compiled with XLA


def compile_seconds(function: Callable, specs: Sequence[object], reps: int = 3) -> float:
    """Median wall of `jax.jit(function).lower(*specs).compile()` over `reps` fresh compiles
    (`specs`: jax.ShapeDtypeStructs or arrays, as lower() takes them)."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)

    def lowered() -> jax.stages.Lowered:
        jax.clear_caches()
        return jax.jit(lambda *args: function(*args), keep_unused=True).lower(*specs)

    if not _started:
        lowered().compile()
        _started.append(True)
    times = []
    for _ in range(reps):
        lowering = lowered()
        started = time.perf_counter()
        lowering.compile()
        times.append(time.perf_counter() - started)
    return statistics.median(times)
