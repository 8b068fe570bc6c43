"""The largest row block of a matmul nest, in 128-row tiles, which two tools must agree on.

hlo_opt's `tile_order` strip-mines a dot's row loop into blocks of at most MAX_ROW_BLOCK tiles
(a power of two: the block's accumulators take at most half of PSUM's eight banks), so a moving
tile loaded once serves the whole block. hlo2penguin's lowering gives a dot's row groups (lhs free
dimensions [g..., r]) an axis of their own only where those blocks divide a group's row tiles or
are divided by them; otherwise a block would span two groups and the weights be read again.
"""

MAX_ROW_BLOCK = 4
