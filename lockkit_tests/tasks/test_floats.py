"""Floats in a task's arguments and result round-trip as floats (``1.0`` stays ``1.0``) on every vendor."""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus

from lockkit_tests.tasks import jobs
from lockkit_tests.tasks.helpers import backend_on, run_worker, vendor_aliases

pytestmark = pytest.mark.parametrize("alias", vendor_aliases())


def test_float_arguments_and_result_stay_floats(alias: str) -> None:
    with backend_on(alias) as backend:
        result = jobs.echo.enqueue(1.0, 2.5, -0.0, n=3, x=10.0)
        fetched = jobs.echo.get_result(result.id)
        assert fetched.args == [1.0, 2.5, -0.0]
        assert [type(value) for value in fetched.args] == [float, float, float]
        assert type(fetched.kwargs["x"]) is float
        assert type(fetched.kwargs["n"]) is int
        run_worker(backend)
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        value = result.return_value
        assert value == {"args": [1.0, 2.5, -0.0], "kwargs": {"n": 3, "x": 10.0}}
        assert [type(item) for item in value["args"]] == [float, float, float]
        assert type(value["kwargs"]["x"]) is float
        assert type(value["kwargs"]["n"]) is int


def test_floats_jsonb_would_rewrite_stay_the_same_floats(alias: str) -> None:
    """PostgreSQL's jsonb normalises ``1e16`` to ``10000000000000000``: an int, and ``1e300`` another value."""
    floats = jobs.AWKWARD_FLOATS
    with backend_on(alias) as backend:
        result = jobs.echo.enqueue(*floats, x=floats)
        fetched = jobs.echo.get_result(result.id)
        for got in (fetched.args, fetched.kwargs["x"]):
            assert [type(value) for value in got] == [float] * len(floats)
            assert got == floats
        run_worker(backend)
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        for got in (result.return_value["args"], result.return_value["kwargs"]["x"]):
            assert [type(value) for value in got] == [float] * len(floats)
            assert got == floats


def test_floats_stay_floats_through_batched_completions(alias: str) -> None:
    floats = jobs.AWKWARD_FLOATS
    with backend_on(alias) as backend:
        results = [jobs.echo.enqueue(*floats) for _ in range(4)]
        assert run_worker(backend, concurrency=2, batch=4).succeeded == 4
        for result in results:
            result.refresh()
            assert result.return_value["args"] == floats
            assert [type(value) for value in result.return_value["args"]] == [float] * len(floats)
