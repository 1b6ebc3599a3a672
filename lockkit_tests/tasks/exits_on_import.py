"""A tasks module that stops whatever imports it in a worker started with ``LOCKKIT_TESTS_IMPORT_RAISES`` (as a
module that checks its configuration when imported, say): see test_escapes.py. Elsewhere (the test process reading
results) it imports."""

import os

from django.tasks import task

_RAISES = os.environ.get("LOCKKIT_TESTS_IMPORT_RAISES")
if _RAISES == "keyboard":
    raise KeyboardInterrupt("interrupted while importing")
if _RAISES == "exit":
    raise SystemExit("LOCKKIT_TESTS_API_KEY must be set")


@task()
def never_reached() -> int:
    return 1
