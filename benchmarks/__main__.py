"""Entry point: ``python -m benchmarks``."""

from benchmarks.cli import main

raise SystemExit(main())
