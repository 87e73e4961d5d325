"""The never-raise guard of tracking: a failure inside becomes one warning, never a crash.

``@suppress(key, message)`` on a method catches any ``Exception`` of the call, hands it to the
instance's ``_warn`` (a :class:`~._warn.WarnOnce`: said the first time, then every N-th time,
counted per ``key``) with ``message`` formatted with the exception, and returns ``default``.
Training code never sees the exception (docs/reliability.md). The idea is codecarbon's
``@suppress``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def suppress(key: str, message: str, default: Any = None) -> Callable[[F], F]:
    """Decorate a method so that an exception in it is warned about under ``key`` and the
    call returns ``default`` instead. ``message`` holds one ``%s`` (or ``%r``): the
    exception."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                self._warn(key, message, exc)
                return default

        return guarded  # type: ignore[return-value]

    return decorate
