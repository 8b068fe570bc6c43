"""Composite HLO ops rewritten into the elementwise, reduce and bit ops the lowering knows, before it
runs: batch-norm-inference, batch-norm-training and batch-norm-grad (what PyTorch/XLA's BatchNorm
emits) by XLA's BatchNormExpander formulas, and reduce-precision by the bit arithmetic XLA's
elemental emitter uses (round the mantissa to nearest even, then clamp the exponent's range).
A convolution with batch_group_count G (the weight gradient of a grouped or depthwise convolution,
as jax.grad writes it) becomes one with feature_group_count G: output feature group g convolves
the g-th of G runs of the input batch, so the batch's G runs move into the feature dimension
(g-major, a reshape and a transpose) and feature group g reads run g.

Each op becomes a run of new instructions in its place; the last of them takes over the op's id and
name, so its users and the computation's root need no change. The golden evaluator computes the
same ops directly (tools/hlo/composite_ops.py), which is what `--verify` holds the expansion to.
"""

from __future__ import annotations

from ncc.schemas import hlo_pb2
from ncc.tools.hlo.composite_ops import F32_EXPONENT_BITS, F32_EXPONENT_MASK, F32_MANTISSA_BITS, F32_SIGN_MASK
from ncc.tools.hlo.hlo_types import T, dims
from ncc.tools.hlo2penguin.hlo_edit import HloEditor

Instr = hlo_pb2.HloInstructionProto
EXPANDED = frozenset({"batch-norm-inference", "batch-norm-training", "batch-norm-grad", "reduce-precision"})


def _expands(instr: Instr) -> bool:
    return instr.opcode in EXPANDED or instr.opcode == "convolution" and instr.batch_group_count > 1


def expand_composites(module: hlo_pb2.HloModuleProto) -> hlo_pb2.HloModuleProto:
    """`module` itself when it holds none of EXPANDED (or a batch-grouped convolution), else a copy
    with each of them expanded."""
    if not any(_expands(i) for c in module.computations for i in c.instructions):
        return module
    expanded = hlo_pb2.HloModuleProto()
    expanded.CopyFrom(module)
    _Expander(expanded).run()
    return expanded


class _Expander(HloEditor):
    def run(self) -> None:
        for comp in list(self.module.computations):
            if not any(_expands(i) for i in comp.instructions):
                continue
            rewritten: list[Instr] = []
            by_id: dict[int, Instr] = {}
            for instr in comp.instructions:
                if not _expands(instr):
                    rewritten.append(instr)
                    by_id[instr.id] = instr
                    continue
                self.out, self.base = rewritten, instr.name
                operands = [by_id[o] for o in instr.operand_ids]
                if instr.opcode == "convolution":
                    last = self._batch_groups(instr, operands)
                elif instr.opcode == "reduce-precision":
                    last = self._reduce_precision(instr, operands[0])
                else:
                    last = self._batch_norm(instr, operands)
                last.id, last.name = instr.id, instr.name  # users and the root keep pointing at it
                by_id[instr.id] = last
            del comp.instructions[:]
            comp.instructions.extend(rewritten)

    # ---- the ops ---------------------------------------------------------------------------------
    def _batch_groups(self, instr: Instr, ops: list[Instr]) -> Instr:
        """The convolution with its batch's G runs moved into the feature dimension (g-major) and
        feature_group_count G in place of batch_group_count G."""
        lhs, rhs = ops
        dn, groups = instr.convolution_dimension_numbers, instr.batch_group_count
        kind, sizes = lhs.shape.element_type, dims(lhs.shape)
        order = [dn.input_batch_dimension, dn.input_feature_dimension, *dn.input_spatial_dimensions]
        batch, features, spatial = sizes[order[0]], sizes[order[1]], [sizes[d] for d in order[2:]]
        per = batch // groups
        canonical = self.array("transpose", kind, [sizes[d] for d in order], [lhs], dimensions=order)
        runs = self.array("reshape", kind, [groups, per, features, *spatial], [canonical])
        inner = self.array("transpose", kind, [per, groups, features, *spatial], [runs],
                           dimensions=[1, 0, *range(2, 3 + len(spatial))])
        merged = self.array("reshape", kind, [per, groups * features, *spatial], [inner])
        back = [order.index(d) for d in range(len(sizes))]
        regrouped = self.array("transpose", kind, [dims(merged.shape)[j] for j in back], [merged],
                               dimensions=back)
        conv = Instr()
        conv.CopyFrom(instr)
        conv.id, conv.batch_group_count, conv.feature_group_count = self.next_id, 1, groups
        del conv.operand_ids[:]
        conv.operand_ids.extend([regrouped.id, rhs.id])
        self.next_id += 1
        self.out.append(conv)
        return conv

    def _reduce_precision(self, instr: Instr, x: Instr) -> Instr:
        """The mantissa rounded to nearest even (a carry may round up into the exponent, or to inf),
        then values beyond the smaller exponent's range made ±inf or ±0; NaN kept."""
        kind = x.shape.element_type
        wide = x if kind == T.F32 else self.unary("convert", x, T.F32)
        shape = dims(x.shape)
        bits = self.unary("bitcast-convert", wide, T.U32)
        mantissa_bits, exponent_bits = instr.mantissa_bits, instr.exponent_bits
        if mantissa_bits < F32_MANTISSA_BITS:
            dropped = F32_MANTISSA_BITS - mantissa_bits
            last_kept = self.binary("and", self.binary("shift-right-logical", bits,
                                                       self.constant(dropped, T.U32, shape)),
                                    self.constant(1, T.U32, shape))
            bias = self.binary("add", last_kept, self.constant((1 << (dropped - 1)) - 1, T.U32, shape))
            kept = ~((1 << dropped) - 1) & 0xFFFFFFFF
            bits = self.binary("and", self.binary("add", bits, bias), self.constant(kept, T.U32, shape))
        if exponent_bits < F32_EXPONENT_BITS:
            reduced_bias = (1 << (exponent_bits - 1)) - 1
            exponent = self.binary("and", bits, self.constant(F32_EXPONENT_MASK, T.U32, shape))
            sign = self.binary("and", bits, self.constant(F32_SIGN_MASK, T.U32, shape))
            highest = self.constant((127 + reduced_bias) << F32_MANTISSA_BITS, T.U32, shape)
            lowest = self.constant((127 - reduced_bias) << F32_MANTISSA_BITS, T.U32, shape)
            infinity = self.binary("or", sign, self.constant(F32_EXPONENT_MASK, T.U32, shape))
            overflows = self.binary("compare", exponent, highest, comparison_direction="GT")
            underflows = self.binary("compare", exponent, lowest, comparison_direction="LE")
            bits = self.select(overflows, infinity, self.select(underflows, sign, bits))
        rounded = self.unary("bitcast-convert", bits, T.F32)
        rounded = self.select(self.binary("compare", wide, wide, comparison_direction="NE"), wide, rounded)
        return rounded if kind == T.F32 else self.unary("convert", rounded, kind)

    def _batch_norm(self, instr: Instr, ops: list[Instr]) -> Instr:
        x = ops[0]
        kind, shape, feature = x.shape.element_type, dims(x.shape), instr.feature_index
        axes = [d for d in range(len(shape)) if d != feature]
        count = 1
        for d in axes:
            count *= shape[d]

        def spread(vector: Instr) -> Instr:  # a feature vector broadcast over x
            return self.array("broadcast", kind, shape, [vector], dimensions=[feature])

        def plus_epsilon(v: Instr) -> Instr:
            return self.binary("add", v, self.constant(instr.epsilon, kind, dims(v.shape)))

        def mean(total: Instr) -> Instr:
            return self.binary("divide", total, self.constant(float(count), kind, dims(total.shape)))

        if instr.opcode == "batch-norm-inference":
            scale, offset, mu, variance = ops[1:]
            true_scale = self.binary("multiply", scale, self.unary("rsqrt", plus_epsilon(variance)))
            true_shift = self.binary("subtract", offset, self.binary("multiply", mu, true_scale))
            return self.binary("add", self.binary("multiply", x, spread(true_scale)), spread(true_shift))
        if instr.opcode == "batch-norm-training":
            scale, offset = ops[1:]
            mu = mean(self.sum_over(x, axes))
            variance = self.binary("subtract", mean(self.sum_over(self.binary("multiply", x, x), axes)),
                                   self.binary("multiply", mu, mu))
            inverse = self.unary("rsqrt", plus_epsilon(spread(variance)))
            normalized = self.binary("multiply", self.binary("subtract", x, spread(mu)), inverse)
            y = self.binary("add", self.binary("multiply", normalized, spread(scale)), spread(offset))
            return self.emit("tuple", instr.shape, [y, mu, variance])
        scale, mu, variance, grad_y = ops[1:]
        centered = self.binary("subtract", x, spread(mu))
        projected = self.sum_over(self.binary("multiply", grad_y, centered), axes)
        grad_offset = self.sum_over(grad_y, axes)
        grad_scale = self.binary("multiply", projected, self.unary("rsqrt", plus_epsilon(variance)))
        inverse = self.unary("rsqrt", plus_epsilon(spread(variance)))
        scaled = mean(self.binary("multiply", spread(scale), inverse))  # scale * rsqrt(var + eps) / N
        counted = self.binary("multiply", grad_y, self.constant(float(count), kind, shape))
        along = self.binary("divide", self.binary("multiply", spread(projected), centered),
                            plus_epsilon(spread(variance)))
        inner = self.binary("subtract", self.binary("subtract", counted, spread(grad_offset)), along)
        grad_x = self.binary("multiply", scaled, inner)
        return self.emit("tuple", instr.shape, [grad_x, grad_scale, grad_offset])
