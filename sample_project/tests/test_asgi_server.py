"""The async endpoint under a real ASGI server: uvicorn with two worker processes, concurrent clients, one hot row."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections

from sample_project.demo.bootstrap import DATABASE_URL_ENV, SETTINGS_MODULE, url_of
from sample_project.inventory.models import Stock

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.contention]
STARTUP = 60.0
REQUESTS = 40


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def uvicorn(url: str, *, workers: int) -> Iterator[int]:
    """Run ``uvicorn sample_project.asgi:application`` on a free port until the block ends; yield the port."""
    port = _free_port()
    env = {**os.environ, DATABASE_URL_ENV: url, "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE}
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--workers",
        str(workers),
        "--port",
        str(port),
        "--no-access-log",
    ]
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(
            [*command, "sample_project.asgi:application"], env=env, stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + STARTUP
            while True:
                assert server.poll() is None, f"uvicorn exited: {log.seek(0) or log.read()[-3000:]}"
                try:
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    connection.request("GET", "/inventory/stock/-")
                    if connection.getresponse().status == 404:  # Django answered: app and database are up
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, (
                    f"uvicorn did not serve: {log.seek(0) or log.read()[-3000:]}"
                )
                time.sleep(0.1)  # polling a server that is starting, not synchronising a test
            yield port
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(30)


def _reserve(port: int) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"sku": "hot", "quantity": 1})
    connection.request("POST", "/inventory/reserve-async", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def test_uvicorn_async_endpoint_never_oversells_a_hot_row() -> None:
    Stock.objects.create(sku="hot", available=REQUESTS // 2)
    with uvicorn(url_of(connections["default"].settings_dict), workers=2) as port:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _: _reserve(port), range(REQUESTS)))
        metrics = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        metrics.request("GET", "/metrics")
        exposed = metrics.getresponse().read().decode()
    statuses = sorted(status for status, _ in results)
    assert statuses.count(200) == REQUESTS // 2, results  # exactly the stock: no oversell, no lost update
    assert {status for status, _ in results} <= {200, 409, 503}
    assert sorted(body["remaining"] for status, body in results if status == 200) == list(
        range(REQUESTS // 2)
    )
    assert Stock.objects.get(pk="hot").available == 0
    # The answering worker's own registry, with lockkit's metrics installed (locked_update's two-message path
    # sends no operation signals: no samples for it).
    assert "# TYPE lockkit_operations_total counter" in exposed
