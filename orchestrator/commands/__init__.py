"""The `ncc` subcommands, one module each (registered, and imported on first use, by cli.py).

A command parses its flags, calls its part's library (pipeline/, farm/, triage/, or a tool's public
API for `run` and `inspect`) and prints the result; errors leave as NccError for cli.py to map.
"""
