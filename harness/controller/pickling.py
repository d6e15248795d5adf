"""Pickling of calls for the ranks, with exact errors.

It says exactly what did not pickle.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from harness import validate
from harness.errors import DistributedError
from harness.protocol.failures import ranks_phrase


def pickle_call(
    fn: Callable[..., Any], args: Iterable[Any], kwargs: Mapping[str, Any] | None, n: int
) -> bytes:
    """The payload of a ``Call``, pickled once.

    It is ``(fn, args, kwargs)`` pickled once for all ``n`` ranks.

    Raises:
        TypeError: ``args`` is not a tuple (or other iterable) of positional arguments, or
            ``kwargs`` not a mapping of keyword arguments (see :func:`validate.call_args`).
        DistributedError: Something does not pickle; the message names the first culprit
            (``fn``, ``args[1]``, ``kwargs['x']``) and shows its repr.
    """
    args = validate.call_args(args)
    kwargs = validate.call_kwargs(kwargs)
    try:
        return pickle.dumps((fn, args, kwargs))
    except Exception as exc:
        parts: list[tuple[str, Any]] = [("fn", fn)]
        parts += [(f"args[{i}]", arg) for i, arg in enumerate(args)]
        parts += [(f"kwargs[{key!r}]", value) for key, value in kwargs.items()]
        name, obj = next(((name, obj) for name, obj in parts if not picklable(obj)), ("call", fn))
        raise DistributedError(
            f"could not pickle {name} ({validate.short_repr(obj)}) to send it to "
            f"{ranks_phrase(range(n))}: "
            f"{type(exc).__name__}: {exc}. Functions must be defined at module level."
        ) from exc


def picklable(obj: Any) -> bool:
    """Whether ``obj`` pickles."""
    return pickle_problem(obj) is None


def pickle_problem(obj: Any) -> str | None:
    """Why ``obj`` does not pickle, or None when it does.

    The reason reads ``"TypeError: cannot pickle '_thread.lock' object"``.
    """
    try:
        pickle.dumps(obj)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
