"""Shared by every stage tool: dtypes, protobuf file I/O, diagnostics and the tool entry point."""
