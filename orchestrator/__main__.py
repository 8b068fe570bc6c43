"""`python -m ncc.orchestrator ...` is the `ncc` command (handy where the console script is not on PATH)."""

import sys

from ncc.orchestrator.cli import main

sys.exit(main())
