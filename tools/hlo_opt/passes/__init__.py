"""The Penguin passes, one module each, run by tools/hlo_opt/optimizer.py in the order of its
list (docs/architecture.md, The Penguin optimizer)."""
