"""Throwaway PostgreSQL servers: a cluster (``initdb`` + ``pg_ctl`` on a free port) that can be stopped, restarted
and killed at will, a hot standby streaming from one (``pg_basebackup -R``), a PgBouncer in front of any server, and
``Topology``, the three together (a primary, its standby, a PgBouncer in front of the primary).

The one implementation of these servers: the fault tests, the topology tests and the soak all start them here.

The binaries come from ``$LOCKKIT_TEST_PG_BIN`` (default ``/usr/lib/postgresql/15/bin``). As root, every server
runs as the ``postgres`` OS user (``initdb`` and PgBouncer refuse root). See
https://www.postgresql.org/docs/current/app-pg-ctl.html and
https://www.postgresql.org/docs/current/app-pgbasebackup.html.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

PG_BIN = Path(os.environ.get("LOCKKIT_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
START_TIMEOUT = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def missing_binaries(*, pgbouncer: bool = False, standby: bool = False) -> str | None:
    """Why a cluster (and PgBouncer, a hot standby, when asked) cannot be started here, or ``None`` when it can."""
    names = ["initdb", "pg_ctl", "postgres"] + (["pg_basebackup"] if standby else [])
    needed = [PG_BIN / name for name in names]
    absent = [str(path) for path in needed if not os.access(path, os.X_OK)]
    if pgbouncer and not os.access(PGBOUNCER, os.X_OK):
        absent.append("pgbouncer (apt-get install pgbouncer)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            absent.append("an OS user 'postgres' to run PostgreSQL as (running as root)")
    return f"missing {', '.join(absent)}" if absent else None


def as_postgres() -> list[str]:
    """The command prefix that runs a program as the ``postgres`` OS user when this process is root."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def run(args: Sequence[str], timeout: float = START_TIMEOUT) -> None:
    """Run a server program (as ``postgres`` when root); raise with its output when it fails."""
    try:
        subprocess.run([*as_postgres(), *args], check=True, capture_output=True, timeout=timeout)
    except subprocess.CalledProcessError as exc:
        output = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        raise RuntimeError(f"{' '.join(args[:2])} failed ({exc.returncode}): {output.strip()}") from exc


def owned_tempdir(prefix: str) -> Path:
    """A new temporary directory the server user owns."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    chown(path)
    return path


def chown(path: Path) -> None:
    """Give ``path`` to the ``postgres`` OS user when this process is root."""
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(path, entry.pw_uid, entry.pw_gid)


def wait_for_port(port: int, what: str, timeout: float = START_TIMEOUT) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not accept connections on port {port} within {timeout}s")


class TempCluster:
    """A PostgreSQL cluster in a temporary directory, on its own port; a context manager that removes it.

    Args:
        settings: Extra server settings (``-c name=value``), e.g. ``{"max_connections": "60"}``.
        prefix: The temporary directory's name prefix.
        port: The TCP port on 127.0.0.1; ``None`` picks a free one.
        standby_of: A running cluster to stream from: the first start makes this cluster a hot standby of it
            (``pg_basebackup -X stream -R``) instead of running ``initdb``.
    """

    def __init__(
        self,
        settings: dict[str, str] | None = None,
        prefix: str = "lockkit-cluster-",
        *,
        port: int | None = None,
        standby_of: TempCluster | None = None,
    ) -> None:
        self.root = owned_tempdir(prefix)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port() if port is None else port
        self.standby_of = standby_of
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "deadlock_timeout": "100ms",
            "shared_buffers": "32MB",
            "max_connections": "60",
            **(settings or {}),
        }
        self._initialised = False

    def __enter__(self) -> TempCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()

    def url(self, dbname: str = "postgres") -> str:
        """A ``postgres://`` URL of ``dbname`` on this cluster over TCP."""
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def _options(self) -> str:
        return " ".join(f"-c {name}={value}" for name, value in self.settings.items()) + f" -p {self.port}"

    def _ctl(self, *args: str, timeout: float = START_TIMEOUT) -> None:
        run([str(PG_BIN / "pg_ctl"), *args, "-D", str(self.data)], timeout=timeout)

    def start(self) -> None:
        """Create the cluster (the first time) and start it; return once it accepts connections."""
        if not self._initialised:
            if self.standby_of is None:
                run(
                    [
                        str(PG_BIN / "initdb"),
                        "-D",
                        str(self.data),
                        "-U",
                        "postgres",
                        "--auth=trust",
                        "-E",
                        "UTF8",
                    ]
                )
            else:
                # -R writes standby.signal and primary_conninfo: a streaming hot standby of the primary.
                primary = ["-h", "127.0.0.1", "-p", str(self.standby_of.port), "-U", "postgres"]
                run([str(PG_BIN / "pg_basebackup"), "-D", str(self.data), *primary, "-X", "stream", "-R"])
            self._initialised = True
        self._ctl("start", "-w", "-l", str(self.log), "-o", self._options())

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: roll back open transactions; ``immediate``: crash-stop, no checkpoint)."""
        self._ctl("stop", "-w", "-m", mode)

    def promote(self) -> None:
        """Promote this hot standby to a primary (a new timeline); return once it accepts writes."""
        self._ctl("promote", "-w")

    def restart(self, mode: str = "fast") -> float:
        """Stop and start the server; return how long it refused connections, in seconds."""
        began = time.monotonic()
        self._ctl("restart", "-w", "-m", mode, "-l", str(self.log), "-o", self._options())
        return time.monotonic() - began

    def running(self) -> bool:
        """Whether the server accepts connections."""
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True
        return False

    def remove(self) -> None:
        """Crash-stop the server if it runs, and delete its directory."""
        if self._initialised:
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PgBouncer:
    """A PgBouncer in transaction pooling mode in front of ``host:port`` (``host`` may be a socket directory).

    Args:
        host, port: The PostgreSQL server.
        settings: Extra ``[pgbouncer]`` settings, e.g. ``{"client_idle_timeout": "1"}``.
        listen_port: PgBouncer's own TCP port on 127.0.0.1; ``None`` picks a free one.
    """

    def __init__(
        self, host: str, port: int, settings: dict[str, str] | None = None, *, listen_port: int | None = None
    ) -> None:
        self.root = owned_tempdir("lockkit-pgbouncer-")
        self.port = free_port() if listen_port is None else listen_port
        self.upstream = (host, port)
        self.settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": str(self.root),
            "auth_type": "any",
            "pool_mode": "transaction",
            "default_pool_size": "4",
            "max_client_conn": "100",
            "ignore_startup_parameters": "extra_float_digits,options",
            "logfile": str(self.root / "pgbouncer.log"),
            **(settings or {}),
        }
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Write the configuration and start PgBouncer; return once it accepts connections."""
        host, port = self.upstream
        ini = self.root / "pgbouncer.ini"
        lines = ["[databases]", f"* = host={host} port={port} user=postgres", "[pgbouncer]"]
        lines += [f"{name} = {value}" for name, value in self.settings.items()]
        ini.write_text("\n".join(lines) + "\n")
        chown(ini)
        self._process = subprocess.Popen(
            [*as_postgres(), PGBOUNCER, str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_port(self.port, "PgBouncer")

    def stop(self) -> None:
        """Stop PgBouncer (closing its server connections) and delete its directory."""
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
            self._process = None
        shutil.rmtree(self.root, ignore_errors=True)


class Topology:
    """A primary, a hot standby streaming from it, and a PgBouncer (transaction pooling) in front of the primary.

    ``start()`` starts them in that order, ``stop()`` stops them in reverse and removes their directories; a
    context manager too. The ports may be chosen beforehand (a settings module names them before any server runs).

    Args:
        primary_port, replica_port, pgbouncer_port: TCP ports on 127.0.0.1; ``None`` picks free ones.
        settings: Extra server settings of both PostgreSQL servers.
        pgbouncer_settings: Extra ``[pgbouncer]`` settings.
    """

    def __init__(
        self,
        *,
        primary_port: int | None = None,
        replica_port: int | None = None,
        pgbouncer_port: int | None = None,
        settings: dict[str, str] | None = None,
        pgbouncer_settings: dict[str, str] | None = None,
    ) -> None:
        self.primary = TempCluster(settings, "lockkit-primary-", port=primary_port)
        self.replica = TempCluster(settings, "lockkit-replica-", port=replica_port, standby_of=self.primary)
        self.pgbouncer = PgBouncer(
            "127.0.0.1", self.primary.port, pgbouncer_settings, listen_port=pgbouncer_port
        )

    def __enter__(self) -> Topology:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the primary, then its standby, then PgBouncer; return once all three accept connections."""
        self.primary.start()
        self.replica.start()
        self.pgbouncer.start()

    def stop_pgbouncer(self) -> None:
        """Stop PgBouncer, which closes its server connections (a database behind it can then be dropped)."""
        self.pgbouncer.stop()

    def stop(self) -> None:
        """Stop PgBouncer, the standby and the primary, and remove their directories."""
        self.pgbouncer.stop()
        self.replica.remove()
        self.primary.remove()

    def wait_for_replay(self, timeout: float = 10.0) -> None:
        """Wait until the standby has replayed everything the primary has written so far (WAL positions are
        per cluster, so this also covers a database created after the standby started).

        Raises:
            TimeoutError: The standby did not catch up within ``timeout`` seconds.
        """
        import psycopg  # only the topology's users need the driver

        def connect(port: int) -> psycopg.Connection[tuple[object, ...]]:
            return psycopg.connect(
                host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True
            )

        with connect(self.primary.port) as primary, connect(self.replica.port) as replica:
            row = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            assert row is not None
            deadline = time.monotonic() + timeout
            while True:
                done = replica.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [row[0]]).fetchone()
                if done is not None and done[0]:
                    return
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the replica did not replay up to {row[0]} within {timeout}s")
                time.sleep(0.01)
