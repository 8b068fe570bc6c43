"""Encode every semaphore wait's threshold as the two 32-bit words of the engines' wait instruction.

alloc_semaphores gives each wait a threshold: the running count its producer's thread reaches
when that producer completes, a 64-bit value in BIR. The wait instruction carries it as two
32-bit words, `value_lo` (bits 0-31) and `value_hi` (bits 32-63); this pass writes them and marks
the program lowered (attribute `walrus.sync_lowered`), after which a pass that would add a wait
(sync_dve_pool, semaphore_reset) refuses to run (E402) rather than leave one unencoded.

What reads the words: the simulator executes a lowered wait from them, not from `value`, as the
hardware would; birverifier's rule `wait_value` refuses a program whose words disagree with the
threshold, a threshold outside 0 .. 2^64 - 1, or, once the program is lowered, a wait without
words. A threshold that does not fit (a negative one, possible only in hand-made BIR) is E405;
inside a loop a threshold may start below 0 (a rotation wait of the first iterations, which
holds at once) and its words encode the first iteration's, 0.

Needs semaphores (alloc_semaphores); runs after every pass that adds waits and before codegen,
which copies the instructions into the streams the NEFF carries. Counters: waits_lowered,
largest_wait_value, waits_with_high_word (thresholds of 2^32 or more).
"""

from __future__ import annotations

from ncc.tools.common.errors import CompileError
from ncc.tools.target import WAIT_VALUE_LIMIT, wait_words
from ncc.tools.walrus_driver.context import SYNC_LOWERED, PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "lower_sync"


@register(NAME)
def run(ctx: PassContext) -> None:
    ctx.require_synchronized()
    if ctx.codegen_done:
        ctx.fail_needs_before("codegen (the streams would keep the unencoded waits)")
    program = ctx.program
    lowered = largest = high = 0
    for instr in program.instructions:
        for wait in instr.waits:
            value = wait.value
            if wait.loop_steps:  # a loop's wait: the words encode its first iteration's threshold
                value = max(0, value)
            if not 0 <= value < WAIT_VALUE_LIMIT:
                raise CompileError(
                    "E405",
                    f"{NAME}: {instr.name or instr.id}: wait for semaphore {wait.semaphore} >= {value} "
                    "has a threshold outside 0 .. 2^64 - 1",
                    instr.name,
                )
            wait.value_lo, wait.value_hi = wait_words(value)
            lowered += 1
            largest = max(largest, value)
            high += wait.value_hi != 0
    program.attributes[SYNC_LOWERED] = "1"
    ctx.set_stat("waits_lowered", lowered)
    ctx.set_stat("largest_wait_value", largest)
    ctx.set_stat("waits_with_high_word", high)
