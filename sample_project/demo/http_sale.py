"""The flash sale over HTTP: gunicorn serves the JSON endpoints with several worker processes, and client
threads post the orders to ``/inventory/reserve`` concurrently. The tables are audited as in the direct sale.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sample_project.demo.bootstrap import DATABASE_URL_ENV, SETTINGS_MODULE
from sample_project.demo.flash_sale import LABELS, SaleResult, audit_stock, reset_stock
from sample_project.demo.orders import load_orders, sale_of, starting_stock
from sample_project.demo.report import sale_table
from sample_project.demo.runner import DemoOptions
from sample_project.demo.stats import Totals, WorkerStats

STARTUP_TIMEOUT = 60.0


class ServerError(RuntimeError):
    """gunicorn did not start, or stopped serving."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def gunicorn(url: str, *, workers: int) -> Iterator[tuple[str, int]]:
    """Run ``gunicorn sample_project.wsgi`` with ``workers`` processes on a free port; yield its address.

    Raises:
        ServerError: it did not answer within a minute (its log is in the message).
    """
    port = _free_port()
    env = {**os.environ, DATABASE_URL_ENV: url, "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE}
    command = [sys.executable, "-m", "gunicorn", "--workers", str(workers), "--bind", f"127.0.0.1:{port}"]
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen([*command, "sample_project.wsgi"], env=env, stdout=log, stderr=log)
        try:
            _wait_until_serving(server, port, log)
            yield "127.0.0.1", port
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(30)


def _wait_until_serving(server: subprocess.Popen[bytes], port: int, log: object) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/inventory/stock/-")
            if connection.getresponse().status == 404:  # Django answered: the app and database are up
                return
        except OSError:
            pass
        time.sleep(0.1)  # polling a server that is starting, not synchronising a test
    log.seek(0)  # type: ignore[attr-defined]
    raise ServerError(f"gunicorn did not start serving on port {port}:\n{log.read()[-3000:]}")  # type: ignore[attr-defined]


def _client(
    address: tuple[str, int], implementation: str, orders: list[tuple[str, int]], stats: WorkerStats
) -> None:
    connection = http.client.HTTPConnection(*address, timeout=60)
    stats.started = time.monotonic()
    for sku, quantity in orders:
        body = json.dumps({"sku": sku, "quantity": quantity, "impl": implementation})
        began = time.perf_counter()
        try:
            connection.request("POST", "/inventory/reserve", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            stats.errors += 1
            stats.first_error = stats.first_error or f"{type(exc).__name__}: {exc}"
        else:
            if response.status == 200:
                stats.confirm(sku, quantity)
            elif response.status == 409:
                stats.refusals += 1
            elif response.status == 503:
                stats.lock_timeouts += 1
            else:
                stats.errors += 1
                stats.first_error = stats.first_error or f"HTTP {response.status}: {payload[:200]!r}"
        stats.latencies.append(time.perf_counter() - began)
        stats.operations += 1
    stats.finished = time.monotonic()
    connection.close()


def run_http_sale(
    address: tuple[str, int],
    implementation: str,
    orders: list[tuple[str, int]],
    stock: dict[str, int],
    *,
    clients: int,
    progress: Callable[[int], None] = lambda done: None,
    timeout: float = 600.0,
) -> SaleResult:
    """Reset the stock, post ``orders`` from ``clients`` threads to the server at ``address``, audit."""
    reset_stock(stock)
    shares = [WorkerStats() for _ in range(clients)]
    threads = [
        threading.Thread(
            target=_client, args=(address, implementation, orders[i::clients], shares[i]), daemon=True
        )
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.1)
            progress(sum(s.operations for s in shares))
    if any(thread.is_alive() for thread in threads):
        raise ServerError(f"the HTTP clients had not finished after {timeout:.0f}s")
    progress(sum(s.operations for s in shares))
    totals = Totals.of(shares)
    return SaleResult(implementation, totals, audit_stock(stock, totals.confirmed))


def run_http_demo(options: DemoOptions, console: Console) -> int:
    """``python -m sample_project demo --http``: the flash sale through gunicorn; exit status 1 on a broken
    invariant."""
    orders = load_orders(options.orders_file, options.limit)
    stock = starting_stock(orders, options.stock_ratio)
    clients = 2 * options.workers
    results: list[SaleResult] = []
    columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with (
        gunicorn(options.url, workers=options.workers) as address,
        Progress(*columns, console=console) as bar,
    ):
        for implementation in options.implementations:
            placed, starting = sale_of(implementation, orders, options.stock_ratio, options.naive_orders)
            task = bar.add_task(f"HTTP sale: {LABELS[implementation]}", total=len(placed))
            results.append(
                run_http_sale(
                    address,
                    implementation,
                    placed,
                    starting,
                    clients=clients,
                    progress=lambda done, task=task: bar.update(task, completed=done),  # type: ignore[misc]
                )
            )
    title = (
        f"HTTP flash sale: {len(orders):,} orders, gunicorn with {options.workers} workers, {clients} clients"
    )
    console.print(
        sale_table(results, orders=len(orders), workers=options.workers, skus=len(stock), title=title)
    )
    broken = [
        f"{LABELS[r.implementation]}: {r.audit}"
        for r in results
        if r.implementation != "naive" and (r.audit.oversold or not r.audit.consistent or r.totals.errors)
    ]
    for problem in broken:
        console.print(f"[bold red]lockkit invariant broken:[/bold red] {problem}")
    return 1 if broken else 0


__all__ = ["gunicorn", "run_http_demo", "run_http_sale"]
