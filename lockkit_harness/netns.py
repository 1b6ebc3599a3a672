"""A peer that stops answering, for real: an address in a network namespace of its own, joined to this one by a
veth pair whose far end can be taken down. Packets to it then vanish: no reply, no RST, no ACK.

A proxy on loopback cannot model a dead peer: its kernel keeps acknowledging the client's data and keepalive
probes whatever the proxy does, so the client's ``tcp_user_timeout`` and keepalives never fire. With the far end
of the link down, the client's kernel retransmits into the void, exactly as across a network cut, and those
bounds are what end the wait. A listening socket is created inside the namespace (``listen()``; a ``FaultProxy``
accepts on it); everything else stays in this process's namespace. Needs root (``ip netns``, ``setns``). See
https://man7.org/linux/man-pages/man8/ip-netns.8.html and https://man7.org/linux/man-pages/man2/setns.2.html.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import socket
import subprocess
import threading
from types import TracebackType

IP = shutil.which("ip") or "/usr/sbin/ip"
_CLONE_NEWNET = 0x40000000
_serial = itertools.count(1)


def missing() -> str | None:
    """Why a link cannot be made here, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    if not os.access(IP, os.X_OK):
        return "missing ip (apt-get install iproute2)"
    return None


def _ip(*args: str) -> None:
    try:
        subprocess.run([IP, *args], check=True, capture_output=True, timeout=30)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(
            f"ip {' '.join(args)} failed: {exc.stderr.decode(errors='replace').strip()}"
        ) from exc


class Link:
    """A namespace with one address, ``self.address``, reachable from here until ``cut()``; a context manager.

    ``cut()`` takes the namespace's end of the link down (every packet to or from it is dropped from then on,
    silently, established connections included); ``restore()`` brings it back. ``__exit__`` deletes the
    namespace and the link.
    """

    def __init__(self) -> None:
        serial = next(_serial)
        tag = f"{os.getpid() % 100000}{serial}"
        self.namespace = f"lockkit-{tag}"
        self.outer, self.inner = f"lk{tag}o", f"lk{tag}i"  # interface names: at most 15 characters
        # A /30 of 10.213.0.0/16 per link, from the pid and a serial: distinct for concurrent test processes.
        block = (os.getpid() * 7 + serial) % 16384
        base = (10 << 24) | (213 << 16) | (block << 2)
        self.gateway = socket.inet_ntoa((base + 1).to_bytes(4, "big"))
        self.address = socket.inet_ntoa((base + 2).to_bytes(4, "big"))
        self._made = False

    def __enter__(self) -> Link:
        try:
            _ip("netns", "add", self.namespace)
            self._made = True
            _ip(
                "link", "add", self.outer, "type", "veth", "peer", "name", self.inner, "netns", self.namespace
            )
            _ip("addr", "add", f"{self.gateway}/30", "dev", self.outer)
            _ip("link", "set", self.outer, "up")
            _ip("-n", self.namespace, "addr", "add", f"{self.address}/30", "dev", self.inner)
            _ip("-n", self.namespace, "link", "set", "lo", "up")
            self.restore()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()

    def listen(self) -> socket.socket:
        """A TCP socket listening on ``self.address`` (a free port), inside the namespace.

        ``setns`` moves only the calling thread, so a short-lived thread makes the socket; the socket stays in the
        namespace it was made in.
        """
        made: list[socket.socket] = []
        failed: list[BaseException] = []

        def inside() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                with open(f"/run/netns/{self.namespace}") as handle:
                    if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns failed")
                # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say TCP.
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self.address, 0))
                sock.listen(128)
                sock.setblocking(False)
                made.append(sock)
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=inside, name="netns-listen")
        thread.start()
        thread.join(10)
        if failed:
            raise failed[0]
        if not made:
            raise RuntimeError(f"no socket made in {self.namespace}")
        return made[0]

    def cut(self) -> None:
        """Drop every packet to and from the namespace from now on (no RST, no FIN, no ICMP reaches anyone)."""
        _ip("-n", self.namespace, "link", "set", self.inner, "down")

    def restore(self) -> None:
        """Carry packets again."""
        _ip("-n", self.namespace, "link", "set", self.inner, "up")

    def remove(self) -> None:
        """Delete the namespace (its end of the link goes with it, and so does ours)."""
        if self._made:
            subprocess.run([IP, "netns", "del", self.namespace], capture_output=True, timeout=30, check=False)
            subprocess.run([IP, "link", "del", self.outer], capture_output=True, timeout=30, check=False)
            self._made = False
