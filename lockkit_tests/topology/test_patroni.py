"""Stock and claims workers on a real Patroni cluster through a switchover, a crash of the leader's machine and a
peer that stops answering, reconciled from the database (issue 23).

``lockkit_harness.patroni.PatroniCluster``: etcd and two PostgreSQL 15 nodes under Patroni, synchronous
replication. Django reaches them with one multi-host alias (``target_session_attrs=read-write``, connect and
keepalive bounds), each node through a ``FaultProxy`` that listens in a network namespace of its own
(``lockkit_harness.netns.Link``), so that its link can be cut for real: packets dropped, no reply and no RST.
Worker threads reserve stock with ``@locked_operation`` (an audit row per reservation, an ``on_commit`` callback)
and claim and complete jobs (``claim_next``, ``fenced``, ``complete``), recording every answer lockkit gave. The
faults: a switchover (``POST /switchover``), SIGKILL of the leader's Patroni and PostgreSQL while COMMITs wait for
its frozen walsender (the standby takes over after the leader key's ttl, without them), and the new leader's link
cut while the workers run. Then, from the final leader's
rows: no acknowledged reservation missing (no phantom commit, no acknowledged write lost), no reservation reported
failed that committed, ``on_commit`` callbacks exactly for the acknowledged ones, no claim token issued twice,
every completion fenced by a claim that was returned; no worker wedged (each returns while the peer is dead and
succeeds after it is back); and the next call in this process works.

Runs only with ``-m patroni`` (its own CI step, ``.ci/run``): ``lockkit_tests/conftest.py`` deselects it from any
run whose ``-m`` does not name it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from django.db import connections

import lockkit
from lockkit import RetryPolicy
from lockkit.claims import claim_next, complete, fenced
from lockkit_harness import netns, patroni
from lockkit_harness.patroni import PatroniCluster
from lockkit_harness.proxy import FaultProxy
from lockkit_harness.soak.models import Order
from lockkit_tests.models import Job, JobLog, Stock
from lockkit_tests.support.faultkit import create_tables, extra_alias

MISSING = patroni.missing() or netns.missing()
ALIAS = "restartable"
STOCK_WORKERS = 3
CLAIM_WORKERS = 2
INITIAL = 1_000_000
JOBS = 4000
LEASE = 60  # seconds: longer than any failover here (the docs' advice)
RIDE = 15  # seconds: reconnect_within of the reservations, longer than a failover after a crash (ttl 10)
PACE = 0.01  # seconds between two calls of one worker: the machine has 2 cores
BOUND = 90.0  # seconds any wait of this test may take
OPTIONS = {
    "sslmode": "disable",  # the proxies read the protocol
    "target_session_attrs": "read-write",
    "connect_timeout": 2,
    "keepalives": 1,
    "keepalives_idle": 1,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": 3000,
}

pytestmark = [
    pytest.mark.patroni,
    pytest.mark.skipif(MISSING is not None, reason=f"no Patroni cluster here: {MISSING}"),
    pytest.mark.django_db(transaction=True, databases=["default", ALIAS]),
    pytest.mark.timeout(300),
]


@dataclass
class Tally:
    """What one worker was told: each answer lockkit gave it, and when its calls began and ended."""

    name: str
    acked: list[str] = field(default_factory=list)  # reservations done
    unknown: list[str] = field(default_factory=list)  # CommitOutcomeUnknown
    failed: list[tuple[str, str]] = field(default_factory=list)  # (ref, exception): certainly changed nothing
    delivered: list[str] = field(default_factory=list)  # on_commit callbacks run
    claims: list[tuple[int, int]] = field(default_factory=list)  # (job, token) of every claim returned
    completed: list[tuple[int, int]] = field(default_factory=list)  # completions done
    completions_unknown: list[tuple[int, int]] = field(default_factory=list)
    completions_failed: list[tuple[int, int, str]] = field(default_factory=list)
    completions_delivered: list[tuple[int, int]] = field(default_factory=list)
    claims_unknown: int = 0
    untyped: list[str] = field(
        default_factory=list
    )  # failures that are not lockkit's typed errors: none allowed
    errors: Counter[str] = field(default_factory=Counter)
    calls: list[tuple[float, float, bool]] = field(default_factory=list)  # (began, ended, succeeded)
    crash: BaseException | None = None

    def returned_since(self, moment: float) -> bool:
        return any(began >= moment for began, _, _ in self.calls)

    def succeeded_since(self, moment: float) -> bool:
        return any(began >= moment and ok for began, _, ok in self.calls)


@lockkit.locked_operation(ALIAS, retry=RetryPolicy(reconnect_within=RIDE))
def reserve(ref: str, tally: Tally) -> None:
    scope = lockkit.current_scope()
    row = scope.get(Stock, pk="widget")
    row.available -= 1
    row.save(using=ALIAS)
    Order.objects.using(ALIAS).create(ref=ref, sku="widget", quantity=1)
    scope.on_commit(lambda: tally.delivered.append(ref))


def stock_worker(tally: Tally, stop: threading.Event) -> None:
    sequence = 0
    while not stop.is_set():
        sequence += 1
        ref = f"{tally.name}.{sequence}"
        began, ok = time.monotonic(), False
        try:
            reserve(ref, tally)
            tally.acked.append(ref)
            ok = True
        except lockkit.CommitOutcomeUnknown:
            tally.unknown.append(ref)
        except Exception as exc:  # every other answer says: it did not happen
            tally.failed.append((ref, typed(tally, exc)))
            tally.errors[type(exc).__name__] += 1
        tally.calls.append((began, time.monotonic(), ok))
        stop.wait(PACE)


def typed(tally: Tally, exc: Exception) -> str:
    """The failure's class name, recorded as untyped unless it is one of lockkit's errors (``LockError``)."""
    if not isinstance(exc, lockkit.LockError):
        tally.untyped.append(f"{type(exc).__name__}: {exc}")
    return type(exc).__name__


def claims_worker(tally: Tally, stop: threading.Event) -> None:
    while not stop.is_set():
        began, ok = time.monotonic(), False
        try:
            found = claim_next(
                Job.objects.filter(state="pending"),
                worker=tally.name,
                lease=LEASE,
                set={"state": "running"},
                using=ALIAS,
            )
        except lockkit.CommitOutcomeUnknown:
            tally.claims_unknown += 1
            found = []
        except Exception as exc:
            tally.errors[f"claim_next: {typed(tally, exc)}"] += 1
            found = []
        for held in found:
            pair = (int(held.pk), held.token)
            tally.claims.append(pair)
            try:
                with fenced(held) as scope:
                    JobLog.objects.using(ALIAS).create(job_id=held.pk, worker=tally.name, token=held.token)
                    complete(held, set={"state": "done"})
                    scope.on_commit(lambda pair=pair: tally.completions_delivered.append(pair))  # type: ignore[misc]
                tally.completed.append(pair)
                ok = True
            except lockkit.CommitOutcomeUnknown:
                tally.completions_unknown.append(pair)
            except Exception as exc:  # StaleClaim included: nothing was written
                tally.completions_failed.append((*pair, typed(tally, exc)))
                tally.errors[f"complete: {type(exc).__name__}"] += 1
        tally.calls.append((began, time.monotonic(), ok))
        stop.wait(PACE)


def run(target: Callable[[Tally, threading.Event], None], tally: Tally, stop: threading.Event) -> None:
    try:
        target(tally, stop)
    except BaseException as exc:  # a worker must never die: recorded, asserted on
        tally.crash = exc
    finally:
        connections.close_all()


def until(condition: Callable[[], bool], what: str, timeout: float = BOUND) -> float:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)
    return time.monotonic()


@pytest.fixture
def cluster() -> Iterator[tuple[PatroniCluster, dict[str, netns.Link], dict[str, FaultProxy]]]:
    with contextlib.ExitStack() as stack:
        ha = stack.enter_context(PatroniCluster())
        links: dict[str, netns.Link] = {}
        proxies: dict[str, FaultProxy] = {}
        for node in ha.nodes:
            link = stack.enter_context(netns.Link())
            # client_keepalive: the proxy gives up on a client that stopped answering and closes its server
            # session, as a server with tcp_keepalives_idle would: its transaction (and row locks) end.
            proxy = FaultProxy(("127.0.0.1", node.pg_port), listen=link.listen(), client_keepalive=2)
            proxies[node.name] = stack.enter_context(proxy)
            links[node.name] = link
        yield ha, links, proxies


def test_workers_on_a_patroni_cluster_through_switchover_crash_and_a_dead_peer(
    cluster: tuple[PatroniCluster, dict[str, netns.Link], dict[str, FaultProxy]],
) -> None:
    ha, links, proxies = cluster
    first, second = ha.nodes
    hosts = {
        "HOST": f"{links[first.name].address},{links[second.name].address}",
        "PORT": f"{proxies[first.name].port},{proxies[second.name].port}",
        "NAME": "postgres",
        "USER": "postgres",
        "PASSWORD": "",
        "CONN_MAX_AGE": 0,
    }
    with extra_alias(ALIAS, "default", OPTIONS=OPTIONS, **hosts):
        create_tables(ALIAS, Stock, Order, Job, JobLog)
        Stock.objects.using(ALIAS).create(sku="widget", available=INITIAL)
        Job.objects.using(ALIAS).bulk_create(Job(name=f"job-{i}") for i in range(JOBS))
        connections[ALIAS].close()

        stop = threading.Event()
        tallies = [Tally(f"stock-{i}") for i in range(STOCK_WORKERS)]
        tallies += [Tally(f"claims-{i}") for i in range(CLAIM_WORKERS)]
        threads = [
            threading.Thread(
                target=run,
                args=(stock_worker if t.name.startswith("stock") else claims_worker, t, stop),
                name=t.name,
                daemon=True,
            )
            for t in tallies
        ]
        for thread in threads:
            thread.start()
        timeline: dict[str, float] = {}
        try:
            started = time.monotonic()
            until(lambda: all(t.succeeded_since(started) for t in tallies), "every worker to succeed once")

            # 1. A switchover: the standby leads, the old leader follows it synchronously.
            new = ha.switchover()
            assert new is second
            timeline["switchover"] = settled = time.monotonic()
            until(lambda: all(t.succeeded_since(settled) for t in tallies), "progress after the switchover")

            # 2. The leader's machine crashes (Patroni and PostgreSQL killed); the synchronous standby takes over.
            # Its walsender frozen first: commits sent then are committed on the leader only and wait for the
            # standby, so the crash certainly lands on COMMITs in flight whose transactions the failover loses.
            ha.freeze_replication(second)
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            # A reservation (its contenders wait for its row lock) and both claims workers' statements.
            until(lambda: (ha.sql(second, waiting) or 0) >= 3, "commits waiting for the frozen standby")
            crashed, survivor = ha.crash_leader()
            assert (crashed, survivor) == (second, first)
            timeline["crash"] = settled = time.monotonic()
            until(lambda: all(t.succeeded_since(settled) for t in tallies), "progress after the crash")

            # 3. The leader stops answering: its link drops every packet. Every worker's call in flight, and
            # every call it makes meanwhile, must end (keepalives, tcp_user_timeout, connect_timeout): none wedged.
            links[survivor.name].cut()
            timeline["cut"] = cut = time.monotonic()
            until(lambda: all(t.returned_since(cut) for t in tallies), "every worker to return while cut off")
            links[survivor.name].restore()
            timeline["restore"] = back = time.monotonic()
            until(lambda: all(t.succeeded_since(back) for t in tallies), "progress after the peer came back")
        finally:
            stop.set()
            for thread in threads:
                thread.join(BOUND)
        assert [thread.name for thread in threads if thread.is_alive()] == []
        assert [(t.name, repr(t.crash)) for t in tallies if t.crash is not None] == []
        # Every failure is typed (a LockError: it changed nothing, or CommitOutcomeUnknown), never a bare driver
        # error (claims calls that could not connect raised Django's OperationalError before this test).
        assert [(t.name, error) for t in tallies for error in t.untyped] == []

        # Reconciled from the final leader's rows (this thread's connection may point at a crashed node).
        connections[ALIAS].close()
        assert ha.leader() is survivor
        committed = set(Order.objects.using(ALIAS).values_list("ref", flat=True))
        available = Stock.objects.using(ALIAS).get(pk="widget").available
        logs = {
            (job, token): worker
            for job, token, worker in JobLog.objects.using(ALIAS).values_list("job_id", "token", "worker")
        }
        done = set(Job.objects.using(ALIAS).filter(state="done").values_list("pk", flat=True))

        stock = [t for t in tallies if t.name.startswith("stock")]
        acked = [ref for t in stock for ref in t.acked]
        unknown = {ref for t in stock for ref in t.unknown}
        failed = {ref for t in stock for ref, _ in t.failed}
        delivered = [ref for t in stock for ref in t.delivered]
        report = {
            "acked": len(acked),
            "unknown": len(unknown),
            "unknown committed": len(unknown & committed),
            "claims unknown": sum(t.claims_unknown for t in tallies),
            "claims": sum(len(t.claims) for t in tallies),
            "failed": len(failed),
            "errors": sum((t.errors for t in tallies), Counter()),
            "calls": {t.name: len(t.calls) for t in tallies},
            "timeline": {name: round(moment - started, 1) for name, moment in timeline.items()},
        }
        print("patroni topology:", report)
        assert len(acked) == len(set(acked)) > 0
        assert sorted(set(acked) - committed) == []  # no phantom commit, no acknowledged write lost
        assert sorted(failed & committed) == []  # a failure is a failure: it changed nothing
        assert committed <= set(acked) | unknown  # nothing committed that no call was made for
        assert INITIAL - available == len(committed)  # each committed reservation took exactly one unit
        assert sorted(delivered) == sorted(acked)  # on_commit exactly once per acknowledged reservation
        # The reservation whose COMMIT waited for the frozen standby died with the leader: unknown, not "done".
        # Either outcome is then true (WAL already in the socket may reach the standby before its walsender stops,
        # and the promoted standby has it), and the checks above hold for both.
        assert len(unknown) >= 1

        workers = [t for t in tallies if t.name.startswith("claims")]
        claims = [(t.name, pair) for t in workers for pair in t.claims]
        pairs = [pair for _, pair in claims]
        assert len(pairs) > 0
        assert [pair for pair, n in Counter(pairs).items() if n > 1] == []  # no token issued twice
        returned = {pair: name for name, pair in claims}
        # Every completion in the database was made under a claim returned to that very worker (fenced).
        assert {pair: worker for pair, worker in logs.items() if returned.get(pair) != worker} == {}
        completed = [pair for t in workers for pair in t.completed]
        assert sorted(set(completed) - set(logs)) == []  # no acknowledged completion lost
        failed_completions = {(job, token) for t in workers for job, token, _ in t.completions_failed}
        assert sorted(failed_completions & set(logs)) == []
        assert done == {job for job, _ in logs}  # a job is done exactly when its completion row committed
        assert sorted(p for t in workers for p in t.completions_delivered) == sorted(completed)

        # The next call in this process works, on the final leader.
        after = Tally("after")
        reserve("after.1", after)
        assert after.delivered == ["after.1"]
        assert Stock.objects.using(ALIAS).get(pk="widget").available == available - 1
        (held,) = claim_next(Job.objects.filter(state="pending"), worker="after", lease=LEASE, using=ALIAS)
        complete(held, set={"state": "done"})
        assert Job.objects.using(ALIAS).get(pk=held.pk).state == "done"
        connections[ALIAS].close()
