#!/usr/bin/env python
"""Django's command-line utility for the sample project (``SAMPLE_DATABASE_URL`` names its PostgreSQL).

``python -m sample_project manage <command>`` does the same and starts an embedded PostgreSQL when no URL is set.
"""

import os
import sys


def main() -> None:
    """Run the Django command named on the command line, with the sample project's settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sample_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
