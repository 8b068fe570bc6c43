"""Reading the .npz of named input arrays that `ncc run` and `ncc compile --verify-inputs` take:
arg0..argN by parameter number, out0..outM optionally (reference outputs), checked for what ncc
can feed a program (booleans, integers, floats; raw 2-byte records as bf16)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

from ncc.orchestrator.diagnostics import NccError


def load_inputs(path: Path) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(arrays argN, reference arrays outN, other names) of an .npz file; [U008] if it is unreadable.

    Whether the inputs fit the NEFF is the simulator's call (E602 names a missing or mis-shaped
    input); a module without parameters needs no argN at all.
    """
    import numpy as np

    try:
        if not zipfile.is_zipfile(path):  # an .npz is a zip of .npy members
            with open(path, "rb") as handle:
                npy = handle.read(6) == b"\x93NUMPY"
            raise ValueError("it holds one array (.npy), not named arrays arg0, arg1, ..." if npy
                             else "it is not a zip archive of arrays")
        loaded = np.load(path, allow_pickle=False)
        with loaded as data:
            arrays = {name: data[name] for name in data.files}
        for name, array in arrays.items():
            if not isinstance(array, np.ndarray):  # a member that is not an .npy array comes as bytes
                raise ValueError(f"its member {name!r} is not a numpy array")
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        reason = "it holds pickled Python objects, which ncc never loads" if "pickle" in str(err) else err
        # (numpy's own words invite allow_pickle=True; an object array is the only pickle inside a zip)
        raise NccError.of("U008", f"cannot read inputs {path} as an .npz file: {reason}") from None
    args = {name: array for name, array in arrays.items() if re.fullmatch(r"arg\d+", name)}
    for name, array in sorted(args.items()):
        raw_bf16 = array.dtype.kind == "V" and array.dtype.names is None and array.dtype.itemsize == 2
        if array.dtype.kind not in "biuf" and not raw_bf16:  # complex, strings, dates, records
            raise NccError.of(
                "U008",
                f"input {name} in {path} holds {array.dtype} values; ncc takes booleans, integers and floats",
            )
    reference = {name: array for name, array in arrays.items() if re.fullmatch(r"out\d+", name)}
    return args, reference, sorted(set(arrays) - set(args) - set(reference))
