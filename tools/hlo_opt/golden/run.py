"""The GoldenEvaluator job's body: reference outputs of an HLO module on seeded (or given) inputs.

Reads a serialized HloModuleProto, verifies it, evaluates it with the numpy interpreter and writes
one TensorSet holding the inputs it used (`arg0..argN`) and the outputs (`out0..outM`), so a
compiled program can later be run on exactly these inputs and compared with exactly these outputs.
"""

from __future__ import annotations

import math
import zipfile

import numpy as np

from ncc.schemas import common_pb2, hlo_pb2
from ncc.tools.common.dtypes import (
    from_compute,
    numpy_to_tensor,
    storage_to_user_array,
    tensor_to_numpy,
    user_array_to_storage,
)
from ncc.tools.common.errors import CompileError
from ncc.tools.common.protoio import read_proto, write_proto
from ncc.tools.hlo.hlo_types import entry_computation, is_tuple, leaf_shapes, ncc_dtype, parameters, root_of
from ncc.tools.hlo.hlo_verify import verify_module
from ncc.tools.hlo_opt.golden.evaluator import evaluate, make_inputs

VERIFY_MAX_ELEMENTS = 1 << 25  # elements of any one of the entry's values: --verify's budget (E305)


def run_golden(module_path: str, output_path: str, seed: int, inputs_path: str | None) -> None:
    """Evaluate the module at `module_path` and write inputs and outputs to `output_path`."""
    module = read_proto(module_path, hlo_pb2.HloModuleProto, "HLO module")
    verify_module(module)
    entry = entry_computation(module)
    params = parameters(entry)
    for param in params:
        if is_tuple(param.shape):
            raise CompileError("E201", f"entry parameter '{param.name}' has a tuple shape, which ncc does "
                                       "not support", param.name)
    check_verify_budget(module)
    if inputs_path is None:
        args = make_inputs(module, seed)
    elif zipfile.is_zipfile(inputs_path):
        args = read_npz_inputs(inputs_path, [param.shape.element_type for param in params])
    else:
        args = read_inputs(inputs_path, len(params))
    outputs = evaluate(module, args, verify=False)
    root = root_of(entry)
    tensors = common_pb2.TensorSet()
    for index, param in enumerate(params):
        tensors.tensors.append(_tensor(f"arg{index}", np.asarray(args[index]), param.shape.element_type))
    for index, (value, shape) in enumerate(zip(outputs, leaf_shapes(root.shape), strict=True)):
        tensors.tensors.append(_tensor(f"out{index}", value, shape.element_type))
    write_proto(output_path, tensors)


def check_verify_budget(module: hlo_pb2.HloModuleProto) -> None:
    """E305 when a value of the entry computation holds more than VERIFY_MAX_ELEMENTS elements:
    the golden evaluator and then the simulator hold and compute such a value on the host, a
    tile's worth at a time for the simulator (a batch norm over f32[128,64,112,112], 100M
    elements an array, ran the two for more than two minutes), so past the budget `--verify` is
    refused at once rather than after minutes; the compile without it is not limited by this."""
    entry = entry_computation(module)
    sizes = [(math.prod(leaf.dimensions), instr.name) for instr in entry.instructions
             for leaf in leaf_shapes(instr.shape)]
    largest, name = max(sizes, default=(0, entry.name))
    if largest > VERIFY_MAX_ELEMENTS:
        raise CompileError("E305", f"too large to verify: '{name}' holds {largest:,} elements; the "
                                   f"--verify budget is {VERIFY_MAX_ELEMENTS:,} a value (compile without "
                                   "--verify)", name)


def read_inputs(path: str, count: int) -> list[np.ndarray]:
    """Inputs from a TensorSet: tensors named arg0..arg{count-1} (or, without such names, in order)."""
    tensor_set = read_proto(path, common_pb2.TensorSet, "input tensors")
    by_name = {tensor.name: tensor for tensor in tensor_set.tensors}
    if all(f"arg{i}" in by_name for i in range(count)):
        chosen = [by_name[f"arg{i}"] for i in range(count)]
    elif len(tensor_set.tensors) == count:
        chosen = list(tensor_set.tensors)
    else:
        held = len(tensor_set.tensors)
        raise CompileError("E104", f"{path} holds {held} tensors, the module takes {count} inputs (name them "
                                   "arg0..argN)", path)
    arrays = []
    for tensor in chosen:
        try:
            arrays.append(storage_to_user_array(tensor_to_numpy(tensor), tensor.dtype))
        except (KeyError, ValueError) as err:
            raise CompileError("E104", f"input tensor '{tensor.name}' in {path} is malformed: {err}",
                               path) from None
    return arrays


def read_npz_inputs(path: str, element_types: list[int]) -> list[np.ndarray]:
    """Inputs arg0..argN of an .npz, as `ncc run` takes them (bf16 widened to f32, or its 16-bit
    words), each converted to its parameter's element type; a missing or unreadable one is E104
    (a shape that does not fit is the evaluator's E104)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [f"arg{k}" for k in range(len(element_types)) if f"arg{k}" not in data.files]
            if missing:
                count = len(element_types)
                raise CompileError("E104", f"{path} has no {', '.join(missing)}: the module takes {count} "
                                           f"inputs, arg0..arg{count - 1}", path)
            arrays = [data[f"arg{k}"] for k in range(len(element_types))]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise CompileError("E104", f"cannot read inputs {path} as an .npz file: {err}", path) from None
    converted = []
    for k, (array, xla_type) in enumerate(zip(arrays, element_types, strict=True)):
        dtype = ncc_dtype(xla_type)
        try:
            converted.append(storage_to_user_array(user_array_to_storage(array, dtype), dtype))
        except (TypeError, ValueError) as err:
            raise CompileError("E104", f"input arg{k} in {path} cannot be read as the parameter's type: "
                                       f"{err}", path) from None
    return converted


def _tensor(name: str, values: np.ndarray, xla_type: int) -> common_pb2.Tensor:
    dtype = ncc_dtype(xla_type)
    return numpy_to_tensor(name, from_compute(values, dtype), dtype)
