"""The name a ``locked_operation`` is known by in signals, logs, metric labels and span names.

A qualified name from the code (``module.Class.function``), never a ``repr()``: a partial's bound arguments (an
e-mail address) and an object's memory address must not reach Prometheus labels or span names.
"""

from __future__ import annotations

import functools
import inspect

# Longer names are cut: a label value is a key of every time series it is part of.
MAX_LENGTH = 200


def _qualified(target: object) -> str:
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not isinstance(qualname, str):
        qualname = type(target).__qualname__
    return f"{module}.{qualname}" if isinstance(module, str) and module else qualname


def operation_name(func: object) -> str:
    """Return the name of the code ``func`` runs: ``module.qualname`` of the function, never its ``repr()``.

    A ``functools.partial`` (or ``partialmethod``) is named after the function it wraps, a bound method after its
    function, a callable object after the function it wraps (``functools.update_wrapper``) or else its class:
    bound arguments, instances and memory addresses never appear.
    The result depends on the code only, so the set of names (and of metric label values) is bounded by it.

    Args:
        func: The decorated callable.

    Returns:
        The qualified name, at most ``MAX_LENGTH`` characters.
    """
    target = func
    for _ in range(100):  # nested partials; bounded, like every walk lockkit does
        if isinstance(target, (functools.partial, functools.partialmethod)):
            target = target.func
        elif inspect.ismethod(target):
            target = target.__func__
        elif not inspect.isfunction(target) and callable(wrapped := getattr(target, "__wrapped__", None)):
            target = wrapped  # a callable object made with functools.update_wrapper: its function
        else:
            break
    if inspect.isfunction(target) or inspect.isbuiltin(target) or inspect.isclass(target):
        name = _qualified(target)
    else:  # a callable object: its class, never the instance
        name = _qualified(type(target))
    return name[:MAX_LENGTH]


__all__ = ["MAX_LENGTH", "operation_name"]
