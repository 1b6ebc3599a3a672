"""The ceiling: the same SQL driven by pgbench (C, prepared statements) against the same database.

Each transaction is logged (``-l``); the figures are read from those logs over the same window as the Django runs,
so pgbench's connection set-up and warm-up are excluded the same way.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.dbserver import Target
from benchmarks.ops import BATCH, HOT, LEASE, ORDER_ROWS, ROWS
from benchmarks.results import Run, percentile
from lockkit.testing import LockWaitMonitor

_PGBENCH_CANDIDATES = ("/usr/lib/postgresql/15/bin/pgbench", "pgbench")

_RESERVE = """\
BEGIN;
SET LOCAL lock_timeout = '5s';
SELECT id, available, reserved FROM lkbench_item WHERE id = :id LIMIT 21 FOR UPDATE OF lkbench_item \\gset
UPDATE lkbench_item SET available = :available::bigint - 1, reserved = :reserved::bigint + 1 WHERE id = :id;
END;
"""

_CLAIM = f"""\
WITH picked (pk) AS MATERIALIZED (
  SELECT id FROM lkbench_job WHERE state = 'pending' AND lease_expires_at IS NULL ORDER BY id LIMIT {{limit}}
  FOR NO KEY UPDATE OF lkbench_job SKIP LOCKED),
ordered (pk, position) AS MATERIALIZED (SELECT pk, row_number() OVER () FROM picked),
claimed AS (
  UPDATE lkbench_job SET claimed_by = 'pgbench', claim_token = claim_token + 1, claimed_at = statement_timestamp(),
    lease_expires_at = statement_timestamp() + interval '{LEASE:g} seconds', attempts = attempts + 1,
    state = 'running'
  FROM ordered WHERE lkbench_job.id = ordered.pk AND lkbench_job.lease_expires_at IS NULL
  RETURNING lkbench_job.id, lkbench_job.claim_token)
SELECT coalesce(array_agg(id), '{{{{}}}}') AS ids, coalesce(array_agg(claim_token), '{{{{}}}}') AS tokens FROM claimed \\gset
UPDATE lkbench_job SET state = 'done', lease_expires_at = NULL
FROM unnest(:ids::bigint[], :tokens::bigint[]) AS c (id, token)
WHERE lkbench_job.id = c.id AND lkbench_job.claim_token = c.token AND lkbench_job.lease_expires_at IS NOT NULL;
"""

# limit=1, as claim_next(limit=1) sends it: the pick is a scalar subquery; one claim is completed by a guarded UPDATE.
_CLAIM_ONE = f"""\
WITH claimed AS (
  UPDATE lkbench_job SET claimed_by = 'pgbench', claim_token = claim_token + 1, claimed_at = statement_timestamp(),
    lease_expires_at = statement_timestamp() + interval '{LEASE:g} seconds', attempts = attempts + 1,
    state = 'running'
  WHERE id = (SELECT id FROM lkbench_job WHERE state = 'pending' AND lease_expires_at IS NULL ORDER BY id LIMIT 1
    FOR NO KEY UPDATE OF lkbench_job SKIP LOCKED) AND lease_expires_at IS NULL
  RETURNING id, claim_token)
SELECT coalesce(max(id), 0) AS id, coalesce(max(claim_token), 0) AS token FROM claimed \\gset
UPDATE lkbench_job SET state = 'done', lease_expires_at = NULL
WHERE id = :id AND claim_token = :token AND lease_expires_at IS NOT NULL;
"""

SCRIPTS: dict[str, str] = {
    "reserve": f"\\set id random(1, {ROWS})\n{_RESERVE}",
    "hot": f"\\set id {HOT}\n{_RESERVE}",
    "hot_guarded": (
        f"UPDATE lkbench_item SET available = available - 1, reserved = reserved + 1 "
        f"WHERE id = {HOT} AND available >= 1;\n"
    ),
    # Three distinct rows among the first ORDER_ROWS, locked in primary-key order (the lock_all SQL).
    "order_sorted": f"""\
\\set a random(1, {ORDER_ROWS})
\\set ob random(1, {ORDER_ROWS - 1})
\\set oc random(1, {ORDER_ROWS - 2})
\\set oc CASE WHEN :oc >= :ob THEN :oc + 1 ELSE :oc END
\\set b 1 + (:a - 1 + :ob) % {ORDER_ROWS}
\\set c 1 + (:a - 1 + :oc) % {ORDER_ROWS}
BEGIN;
SET LOCAL lock_timeout = '5s';
SELECT id, available, reserved FROM lkbench_item WHERE id IN (:a, :b, :c) ORDER BY id FOR UPDATE OF lkbench_item;
UPDATE lkbench_item SET available = available - 1, reserved = reserved + 1 WHERE id = :a;
UPDATE lkbench_item SET available = available - 1, reserved = reserved + 1 WHERE id = :b;
UPDATE lkbench_item SET available = available - 1, reserved = reserved + 1 WHERE id = :c;
END;
""",
    "claim_one": _CLAIM_ONE,
    # The network's round trip as a C client sees it (the floor's RTT): nothing for the server to do.
    "select1": "SELECT 1;\n",
    "claim_batch": _CLAIM.format(limit=BATCH),
}

#: Units per pgbench transaction (a batched claim completes BATCH jobs).
UNITS: dict[str, int] = {"claim_batch": BATCH}


def executable() -> str | None:
    for candidate in _PGBENCH_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def version() -> str:
    exe = executable()
    if exe is None:
        return "not found"
    return subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout.strip()


def run_seconds(warmup: float, duration: float) -> int:
    """pgbench's ``-T``: whole seconds covering warm-up and window (connection set-up comes on top)."""
    return max(1, math.ceil(warmup + duration + 0.5))


def run(
    target: Target,
    workload: str,
    impl: str,
    script: str,
    procs: int,
    round_: int,
    warmup: float,
    duration: float,
) -> Run:
    """Run ``SCRIPTS[script]`` with ``procs`` clients for ``warmup + duration`` seconds; figures over the window."""
    exe = executable()
    if exe is None:
        raise RuntimeError("pgbench not found (install postgresql-client or postgresql)")
    with tempfile.TemporaryDirectory(prefix="lkbench-pgbench-") as tmp:
        path = Path(tmp) / f"{script}.sql"
        path.write_text(SCRIPTS[script])
        seconds = run_seconds(warmup, duration)
        command = [
            exe, "-n", "-M", "prepared", "-c", str(procs), "-j", str(procs), "-T", str(seconds),
            "-f", str(path), "-l", "--log-prefix", str(Path(tmp) / "log"), *target.pg_args(),
        ]  # fmt: skip
        with LockWaitMonitor() as sampler:
            done = subprocess.run(
                command, capture_output=True, text=True, env=target.pg_env(), timeout=seconds + 60
            )
        if done.returncode != 0:
            raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        entries = _read_logs(Path(tmp))
    if not entries:
        raise RuntimeError(f"pgbench logged no transaction: {done.stdout[-1000:]} {done.stderr[-1000:]}")
    first_start = min(end - latency / 1000 for end, latency in entries)
    begin = first_start + warmup
    inside = [latency for end, latency in entries if begin <= end < begin + duration]
    per = UNITS.get(script, 1)
    return Run(
        workload=workload,
        impl=impl,
        procs=procs,
        round=round_,
        units=len(inside) * per,
        ops=len(inside),
        seconds=duration,
        p50_ms=percentile(inside, 0.50),
        p99_ms=percentile(inside, 0.99),
        lock_waiting=sampler.mean_waiting(begin, begin + duration),
        errors=_failures(done.stdout),
    )


def _read_logs(directory: Path) -> list[tuple[float, float]]:
    """``(completion epoch seconds, latency ms)`` of every logged transaction.

    A line is ``client_id transaction_no time script_no time_epoch time_us``, ``time`` being the latency in us.
    """
    entries: list[tuple[float, float]] = []
    for log in directory.glob("log*"):
        for line in log.read_text().splitlines():
            fields = line.split()
            if len(fields) < 6 or fields[2] in {"skipped", "failed"}:
                continue
            latency_us = float(fields[2])
            entries.append((int(fields[4]) + int(fields[5]) / 1e6, latency_us / 1000))
    return entries


def _failures(stdout: str) -> dict[str, int]:
    for line in stdout.splitlines():
        if line.startswith("number of failed transactions:"):
            count = int(line.split(":", 1)[1].split()[0])
            return {"pgbench failed transactions": count} if count else {}
    return {}
