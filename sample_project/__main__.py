"""``python -m sample_project``: the command line (``demo``, ``serve``, ``manage``, ``soak``)."""

from __future__ import annotations

import sys

from sample_project.demo.cli import main

if __name__ == "__main__":
    sys.exit(main())
