"""A latency relay: a network round trip on loopback, for measuring what production pays per round trip.

The kernel here has no ``netem``, and a Python relay adds its own scheduling delays once several processes share two
cores, so the relay is a small C program (``latency_relay.c`` next to this module), compiled with ``cc`` on first use
into a per-user cache directory. It delays every byte by half the round trip in each direction; bandwidth is not
limited and nothing is reordered.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

_SOURCE = Path(__file__).with_name("latency_relay.c")


def relay_binary() -> Path:
    """Compile the relay (once per source version) and return the executable's path.

    Raises:
        RuntimeError: no C compiler (``cc``) is installed, or it failed.
    """
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lockkit-harness"
    binary = cache / f"latency_relay-{digest}"
    if binary.exists():
        return binary
    compiler = shutil.which("cc")
    if compiler is None:
        raise RuntimeError("the latency relay needs a C compiler (cc) on PATH")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as build:
        out = Path(build) / "latency_relay"
        done = subprocess.run(
            [compiler, "-O2", "-pthread", "-o", str(out), str(_SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"compiling the latency relay failed:\n{done.stderr}")
        out.replace(binary)  # atomic: two processes compiling at once both end with a whole binary
    return binary


class LatencyRelay:
    """A running relay on ``127.0.0.1:<port>`` in front of a PostgreSQL (or any TCP) server.

    Args:
        host: The server's IPv4 address, or the directory of its Unix socket (an absolute path).
        port: The server's port (also names the Unix socket file, ``.s.PGSQL.<port>``).
        rtt: The round trip to add, in seconds (half of it each way).

    Use it as a context manager; ``port`` is where clients connect.
    """

    def __init__(self, host: str, port: int, rtt: float) -> None:
        if rtt < 0:
            raise ValueError(f"rtt must be >= 0 seconds, got {rtt!r}")
        target = str(Path(host) / f".s.PGSQL.{port}") if host.startswith("/") else host
        one_way_us = round(rtt / 2 * 1_000_000)
        self._process = subprocess.Popen(
            [str(relay_binary()), "0", target, str(port), str(one_way_us)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line.startswith("PORT "):
            self._process.kill()
            raise RuntimeError(f"the latency relay did not start (it printed {line!r})")
        self.port = int(line.split()[1])
        self.rtt = rtt

    def close(self) -> None:
        """Stop the relay (its open connections are cut)."""
        self._process.kill()
        self._process.wait(timeout=10)

    def __enter__(self) -> LatencyRelay:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def measure_rtt(conninfo: str, *, count: int = 300) -> dict[str, float]:
    """Time ``SELECT 1`` round trips on one psycopg connection: the median, min and max, in milliseconds."""
    import psycopg

    samples = []
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute("SELECT 1")
        for _ in range(count):
            started = time.perf_counter()
            connection.execute("SELECT 1").fetchone()
            samples.append((time.perf_counter() - started) * 1000)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples)}
