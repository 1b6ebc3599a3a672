"""Entry point: ``python -m benchmarks.tasks``."""

from benchmarks.tasks.run import main

raise SystemExit(main())
