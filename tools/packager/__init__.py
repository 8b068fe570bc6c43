"""The packager: NEFF building, writing and reading (neff.py); CLI `ncc-packager` (__main__.py)."""

from ncc.tools.packager.neff import build_neff, decode_neff, encode_neff, read_neff, write_neff

__all__ = ["build_neff", "decode_neff", "encode_neff", "read_neff", "write_neff"]
