"""Round trips per operation, counted with ``strace -f -e trace=sendto``: the messages a process sends.

libpq writes each request (a simple query, or Parse/Bind/Execute/Sync of one parameterised statement) with one
``send()`` and then waits for the reply, so the ``sendto`` calls made during an operation are its round trips. The
count runs in a child process under strace: it warms each operation up, then writes a marker (to ``/dev/null``,
traced as a ``write``) before and after ``COUNT`` operations, and the trace between the markers is counted.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The operations counted, with the label of the report's table.
OPERATIONS: dict[str, str] = {
    "reserve_hand": "hand-written reservation (atomic + SET LOCAL + select_for_update().get() + save)",
    "reserve_lockkit": "lockkit reservation, @locked_operation",
    "reserve_lockkit_scope": "lockkit reservation, locked() context manager",
    "reserve_locked_update": "lockkit.locked_update() reservation (opening + locking SELECT; UPDATE ...; COMMIT)",
    "reserve_guarded_update": "lockkit.guarded_update() (guarded UPDATE ... RETURNING with its transaction)",
    "hot_guarded": "guarded UPDATE, Django .update() in autocommit",
    "claim_hand": "hand-written claim loop, one job (claim + guarded completion UPDATE)",
    "claim_one": "lockkit claim_next(limit=1) + complete, one job",
    "claim_batch": "lockkit claim_next(limit=20) + complete_many, one batch",
}
#: What the model predicts (issues 25 and 32): the report prints it next to the count.
EXPECTED: dict[str, int] = {
    "reserve_hand": 5,
    "reserve_lockkit": 4,
    "reserve_lockkit_scope": 4,
    "reserve_locked_update": 2,
    "reserve_guarded_update": 1,
    "hot_guarded": 1,
    "claim_hand": 5,
    "claim_one": 2,  # one message per call
    "claim_batch": 2,
}
COUNT = 20
_MARK = "lkbench-roundtrips"


def count() -> dict[str, float] | None:
    """Round trips per operation of each of ``OPERATIONS``; ``None`` when strace is not available or not allowed.

    Run after ``django.setup()`` with the benchmark's tables in place (the claims need pending jobs).
    """
    strace = shutil.which("strace")
    if strace is None:
        return None
    from benchmarks import schema

    schema.reset_jobs(len(OPERATIONS) * COUNT * 25)
    with tempfile.TemporaryDirectory(prefix="lkbench-strace-") as tmp:
        trace = Path(tmp) / "trace"
        command = [strace, "-f", "-qq", "-s", "200", "-e", "trace=sendto,write", "-o", str(trace)]
        from benchmarks import ops

        runnable = [name for name in OPERATIONS if ops.missing(name) is None]
        command += [sys.executable, "-m", "benchmarks.roundtrips", *runnable]
        done = subprocess.run(command, env=os.environ.copy(), capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not trace.exists():
            return None
        return _parse(trace.read_text(errors="replace"))


def _parse(text: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    current: str | None = None
    sent = 0
    for line in text.splitlines():
        if _MARK in line:
            word = line.split(_MARK, 1)[1].split('"', 1)[0].split()
            name, edge = word[0], word[1]
            if edge == "start":
                current, sent = name, 0
            elif edge == "failed":
                current = None
            elif current == name:
                counts[name] = sent / COUNT
                current = None
        elif current is not None and "sendto(" in line:
            sent += 1
    return counts


def _child(names: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    from benchmarks import ops

    marker = os.open(os.devnull, os.O_WRONLY)
    for name in names:
        op = ops.build(name, random.Random(11), 0)
        os.write(marker, f"{_MARK} {name} start".encode())
        try:
            for _ in range(3):  # connection, prepared state and caches warm
                op()
            os.write(marker, f"{_MARK} {name} start".encode())
            for _ in range(COUNT):
                op()
        except Exception as exc:  # one operation that cannot run (say, an API this lockkit lacks) is left out
            print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            os.write(marker, f"{_MARK} {name} failed".encode())
            continue
        os.write(marker, f"{_MARK} {name} end".encode())
    os.close(marker)


if __name__ == "__main__":
    _child(sys.argv[1:])
