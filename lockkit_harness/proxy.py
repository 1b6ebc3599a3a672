"""A TCP proxy between a client and a PostgreSQL or MariaDB/MySQL server that can cut a COMMIT's reply.

The only way to get a genuinely ambiguous COMMIT: the client sends it, and its connection dies before the reply.
The proxy reads the client's protocol messages (PostgreSQL's frontend messages, MySQL's packets), forwards
everything, and when armed, acts on the next ``COMMIT`` the client sends:

- ``"deliver"``: forward it, wait for the server's reply (the commit is done), drop the reply and cut the client:
  the transaction committed, the client cannot know.
- ``"abort"``: never forward it; half-close the server connection and wait until the server has hung up (it
  rolled the transaction back), then cut the client: the transaction aborted, the client cannot know.
- ``"hold"``: never forward it and keep the server connection open, idle in its transaction, until
  ``release_held()``; cut the client: the outcome is undecided while the client looks for it.

With ``late_hangup`` set, a server that hangs up has its last words delivered (a session's farewell error) but
not its end: the client's side stays open until the client sends something, which is dropped as the client's side
is closed (``server_hangups`` counts such ends). So the farewell and the end of the stream reach the client apart,
as they may from a real server.

It runs its own asyncio loop in a daemon thread. See
https://www.postgresql.org/docs/current/protocol-message-formats.html and
https://mariadb.com/kb/en/com_query/.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

Protocol = Literal["postgresql", "mysql"]
Action = Literal["deliver", "abort", "hold"]

# PostgreSQL "untyped" requests sent before the startup message (answered with one byte each when SSL/GSS).
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_MYSQL_COM_QUERY = 0x03
_CHUNK = 65536


@dataclass(eq=False)
class _Link:
    """One proxied client connection and its server connection."""

    client_reader: asyncio.StreamReader
    client_writer: asyncio.StreamWriter
    server_reader: asyncio.StreamReader
    server_writer: asyncio.StreamWriter
    backend_pid: int | None = None
    # Server replies to swallow once a cut began: the reply to the COMMIT is awaited, then the link is cut.
    swallow: asyncio.Event | None = None
    startup_done: bool = False
    pending_one_byte_replies: int = 0
    closed: bool = False
    server_gone: bool = False  # ``late_hangup``: the server hung up, the client's side is still open
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class FaultProxy:
    """A proxy on 127.0.0.1:``port`` in front of ``upstream`` (``(host, port)``, or a Unix socket path).

    Args:
        upstream: The server's address.
        protocol: ``"postgresql"`` or ``"mysql"``: how to find a ``COMMIT`` in the client's stream.
        listen: A listening socket to accept clients on instead of a new one on 127.0.0.1 (e.g. one in a network
            namespace, ``lockkit_harness.netns.Link.listen()``); ``self.port`` is its port.
        client_keepalive: Seconds: probe an idle client connection after that long, and give it up (closing the
            server connection, so its session ends) once the client stops answering, as a server's
            ``tcp_keepalives_idle``/``tcp_user_timeout`` would; ``None`` for no probes.
    """

    def __init__(
        self,
        upstream: tuple[str, int] | str,
        protocol: Protocol = "postgresql",
        *,
        listen: socket.socket | None = None,
        client_keepalive: float | None = None,
    ) -> None:
        self.upstream = upstream
        self.protocol = protocol
        self.port = 0
        self._listen_socket = listen
        self._client_keepalive = client_keepalive
        self.refuse_new = False
        self.cuts: dict[Action, int] = {"deliver": 0, "abort": 0, "hold": 0}
        self.connections = 0
        self._armed: deque[Action] = deque()
        self._arm_filter: Callable[[int | None], bool] | None = None
        self._arm_statement: bytes | None = None  # armed on statements starting so (upper case), not COMMITs
        self._links: set[_Link] = set()
        self._held: list[_Link] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._lock = threading.Lock()
        #: Deliver a hanging-up server's last words but not its end (see the module's docstring).
        self.late_hangup = False
        #: How many server hang-ups ``late_hangup`` kept from their clients so far.
        self.server_hangups = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Listen on a free port (``self.port``) and start forwarding."""
        self._thread.start()
        self.port = self._call(self._listen())

    def stop(self) -> None:
        """Cut every connection and stop listening."""
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _call(self, coro: object) -> int:
        future: concurrent.futures.Future[int] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return future.result(30)

    async def _listen(self) -> int:
        if self._listen_socket is not None:
            self._server = await asyncio.start_server(self._accept, sock=self._listen_socket)
        else:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def _probe(self, writer: asyncio.StreamWriter) -> None:
        """Keepalives and a user timeout on a client connection (``client_keepalive``)."""
        if self._client_keepalive is None:
            return
        sock = writer.get_extra_info("socket")
        seconds = max(1, round(self._client_keepalive))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, (seconds + 2) * 1000)

    async def _shutdown(self) -> int:
        if self._server is not None:
            self._server.close()
        for link in list(self._links) + self._held:
            await self._close(link)
        self._held.clear()
        return 0

    # -- control (from any thread) -----------------------------------------------------------------------------

    def arm(
        self,
        action: Action,
        count: int = 1,
        *,
        backend_pid: int | None = None,
        statement: bytes | None = None,
    ) -> None:
        """Act on the next ``count`` COMMITs (of the connection to ``backend_pid`` only, when given).

        With ``statement`` (``b"INSERT"``), act instead on the next messages whose text starts with it (any case):
        a statement run alone in autocommit commits with its reply, as a ``COMMIT`` does.
        """
        with self._lock:
            self._armed.extend([action] * count)
            self._arm_filter = None if backend_pid is None else (lambda pid: pid == backend_pid)
            self._arm_statement = None if statement is None else statement.upper()

    def disarm(self) -> None:
        """Forget COMMITs armed but not yet seen."""
        with self._lock:
            self._armed.clear()
            self._arm_filter = None
            self._arm_statement = None

    @property
    def armed(self) -> int:
        """How many armed COMMIT actions are still waiting for their COMMIT."""
        with self._lock:
            return len(self._armed)

    def cut_all(self) -> None:
        """Cut every open connection now, both sides (a network failure mid-anything)."""
        self._call(self._cut_all())

    async def _cut_all(self) -> int:
        for link in list(self._links):
            await self._close(link)
        return 0

    def release_held(self) -> None:
        """Close the server connections kept open by ``"hold"`` (the server then rolls them back)."""
        self._call(self._release())

    async def _release(self) -> int:
        held, self._held = self._held, []
        for link in held:
            await self._close(link)
        return 0

    def _take_armed(self, link: _Link) -> Action | None:
        with self._lock:
            if not self._armed:
                return None
            if self._arm_filter is not None and not self._arm_filter(link.backend_pid):
                return None
            return self._armed.popleft()

    # -- forwarding ------------------------------------------------------------------------------------------

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.refuse_new:
            client_writer.close()
            return
        self._probe(client_writer)
        try:
            if isinstance(self.upstream, str):
                server_reader, server_writer = await asyncio.open_unix_connection(self.upstream)
            else:
                server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            return
        self.connections += 1
        link = _Link(client_reader, client_writer, server_reader, server_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.ensure_future(self._client_to_server(link)),
            asyncio.ensure_future(self._server_to_client(link)),
        ]

    async def _close(self, link: _Link, *, client_only: bool = False) -> None:
        for writer in (link.client_writer,) if client_only else (link.client_writer, link.server_writer):
            with contextlib.suppress(Exception):
                writer.close()
        if not client_only:
            link.closed = True
            self._links.discard(link)

    async def _client_to_server(self, link: _Link) -> None:
        buffer = b""
        try:
            while not link.closed:
                chunk = await link.client_reader.read(_CHUNK)
                if not chunk or link.server_gone:
                    break
                buffer += chunk
                messages, buffer = self._split_client(link, buffer)
                for message in messages:
                    if self._is_commit(message):
                        action = self._take_armed(link)
                        if action is not None:
                            await self._cut(link, action, message)
                            return
                    link.server_writer.write(message)
                await link.server_writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if link not in self._held:
                await self._close(link)

    async def _server_to_client(self, link: _Link) -> None:
        buffer = b""
        try:
            while not link.closed:
                chunk = await link.server_reader.read(_CHUNK)
                if not chunk:
                    break
                buffer += chunk
                messages, buffer = self._split_server(link, buffer)
                for message in messages:
                    if link.swallow is not None:
                        if self._ends_reply(message):
                            link.swallow.set()
                        continue
                    if self.protocol == "postgresql" and message[:1] == b"K" and len(message) >= 9:
                        link.backend_pid = struct.unpack("!i", message[5:9])[0]
                    link.client_writer.write(message)
                if link.swallow is None:
                    await link.client_writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if link.swallow is not None:
                link.swallow.set()  # the server hung up: whatever it did, it is done
            if self.late_hangup and link.swallow is None and not link.closed:
                link.server_gone = True  # the client's side closes when it next sends
                self.server_hangups += 1
                with contextlib.suppress(Exception):
                    link.server_writer.close()
            elif link not in self._held:
                await self._close(link)

    async def _cut(self, link: _Link, action: Action, commit: bytes) -> None:
        self.cuts[action] += 1
        if action == "deliver":
            link.swallow = asyncio.Event()
            link.server_writer.write(commit)
            await link.server_writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(link.swallow.wait(), 30)
            await self._close(link)
        elif action == "abort":
            link.swallow = asyncio.Event()
            with contextlib.suppress(Exception):
                link.server_writer.write_eof()
            # The server reads end-of-file, rolls the transaction back and exits; then its side closes.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(link.swallow.wait(), 30)
            await self._close(link)
        else:
            self._held.append(link)
            link.swallow = asyncio.Event()
            await self._close(link, client_only=True)

    # -- protocol framing ----------------------------------------------------------------------------------------

    def _split_client(self, link: _Link, buffer: bytes) -> tuple[list[bytes], bytes]:
        messages: list[bytes] = []
        while True:
            if self.protocol == "mysql":
                if len(buffer) < 4:
                    break
                size = 4 + int.from_bytes(buffer[:3], "little")
            elif not link.startup_done:
                if len(buffer) < 8:
                    break
                size, code = struct.unpack("!ii", buffer[:8])
                if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                    link.pending_one_byte_replies += 1
                elif code != _CANCEL_REQUEST and len(buffer) >= size:
                    link.startup_done = True
            else:
                if len(buffer) < 5:
                    break
                size = 1 + struct.unpack("!i", buffer[1:5])[0]
            if len(buffer) < size:
                break
            messages.append(buffer[:size])
            buffer = buffer[size:]
        return messages, buffer

    def _split_server(self, link: _Link, buffer: bytes) -> tuple[list[bytes], bytes]:
        messages: list[bytes] = []
        while buffer:
            if self.protocol == "mysql":
                if len(buffer) < 4:
                    break
                size = 4 + int.from_bytes(buffer[:3], "little")
            elif link.pending_one_byte_replies:
                link.pending_one_byte_replies -= 1
                size = 1
            else:
                if len(buffer) < 5:
                    break
                size = 1 + struct.unpack("!i", buffer[1:5])[0]
            if len(buffer) < size:
                break
            messages.append(buffer[:size])
            buffer = buffer[size:]
        return messages, buffer

    def _is_commit(self, message: bytes) -> bool:
        """Whether ``message`` is one an armed action acts on: a ``COMMIT``, or the armed ``statement``."""
        if self.protocol == "mysql":
            if len(message) < 5 or message[4] != _MYSQL_COM_QUERY:
                return False
            text = message[5:]
        elif message[:1] == b"Q":
            text = message[5:].rstrip(b"\x00")
        elif message[:1] == b"P":
            # Parse: statement name, NUL, query text, NUL, ...
            body = message[5:]
            name_end = body.find(b"\x00")
            text = body[name_end + 1 : body.find(b"\x00", name_end + 1)]
        else:
            return False
        with self._lock:
            statement = self._arm_statement
        if statement is not None:
            return text.lstrip().upper().startswith(statement)
        # The last statement of the message: lockkit's claims send ``BEGIN; ...; <statement>; COMMIT`` as one.
        last = text.strip().rstrip(b";").rsplit(b";", 1)[-1]
        return last.strip().upper() in (b"COMMIT", b"COMMIT WORK", b"END")

    def _ends_reply(self, message: bytes) -> bool:
        if self.protocol == "mysql":
            return True  # one OK or ERR packet answers a COMMIT
        return message[:1] == b"Z"  # ReadyForQuery
