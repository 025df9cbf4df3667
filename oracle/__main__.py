"""`python -m oracle serve|check|capture ...` (see docs/ORACLE.md)."""

import oracle  # noqa: F401  (starts the load clock before anything heavy is imported)

import sys

from oracle.cli import main

sys.exit(main())
