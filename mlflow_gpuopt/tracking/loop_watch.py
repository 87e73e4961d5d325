"""What the training loop does through libraries that have no hook of their own.

Three wrappers, installed while at least one tracker listens and removed when the last one
stops:

* ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__``: each batch a ``DataLoader``
  yields (also under accelerate's and Lightning's loader wrappers, which iterate a plain
  ``DataLoader``) is reported, so the samples of a step come from the data the step consumed
  rather than from how many times a module was called.
* ``torch.amp.GradScaler.step``: when the scaler found inf/NaN gradients it does not call the
  optimizer's ``step()``, so no optimizer hook fires; the listener is told after each call and
  compares with the optimizer steps it saw, to count a step that did no update.
* ``torch.autograd.backward`` (what ``Tensor.backward()`` calls): a backward ran, so the next
  forward of the tracked model starts a new micro-batch. One call per backward, rather than a
  gradient hook on every forward's output (several microseconds per forward).

A listener is any object with ``on_batch(batch)``, ``on_backward()``,
``scaler_step_begin() -> token`` and ``scaler_step_end(optimizer, token)``; it must not raise
(the wrappers drop what it raises).
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_listeners: tuple[Any, ...] = ()
_originals: dict[str, tuple[Any, str, Any]] = {}


def _targets() -> dict[str, tuple[Any, str]]:
    import torch
    from torch.utils.data import dataloader

    found = {"batch": (dataloader._BaseDataLoaderIter, "__next__"),
             "backward": (torch.autograd, "backward")}
    scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler is not None:
        found["scaler"] = (scaler, "step")
    return found


def _wrap_next(orig: Any) -> Any:
    @functools.wraps(orig)
    def __next__(self: Any) -> Any:  # noqa: N807
        batch = orig(self)
        for listener in _listeners:
            try:
                listener.on_batch(batch)
            except Exception as exc:  # a listener must never break the loop
                logger.debug("gpuopt: batch listener failed: %s", exc)
        return batch

    return __next__


def _wrap_backward(orig: Any) -> Any:
    @functools.wraps(orig)
    def backward(*args: Any, **kwargs: Any) -> Any:
        for listener in _listeners:
            try:
                listener.on_backward()
            except Exception as exc:
                logger.debug("gpuopt: backward listener failed: %s", exc)
        return orig(*args, **kwargs)

    return backward


def _wrap_scaler_step(orig: Any) -> Any:
    @functools.wraps(orig)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        listeners = _listeners
        tokens = []
        for listener in listeners:
            try:
                tokens.append(listener.scaler_step_begin())
            except Exception as exc:
                logger.debug("gpuopt: scaler listener failed: %s", exc)
                tokens.append(None)
        result = orig(self, optimizer, *args, **kwargs)
        for listener, token in zip(listeners, tokens, strict=True):
            try:
                listener.scaler_step_end(optimizer, token)
            except Exception as exc:
                logger.debug("gpuopt: scaler listener failed: %s", exc)
        return result

    return step


class _Handle:
    def __init__(self, listener: Any) -> None:
        self._listener = listener

    def remove(self) -> None:
        global _listeners
        with _lock:
            if self._listener not in _listeners:
                return
            _listeners = tuple(x for x in _listeners if x is not self._listener)
            if not _listeners:
                for cls, name, orig in _originals.values():
                    setattr(cls, name, orig)
                _originals.clear()


def watch(listener: Any) -> _Handle:
    """Report the loop's DataLoader batches and GradScaler steps to ``listener`` until the
    returned handle's ``remove()``."""
    global _listeners
    with _lock:
        if not _originals:
            wrappers = {"batch": _wrap_next, "scaler": _wrap_scaler_step,
                        "backward": _wrap_backward}
            for key, (cls, name) in _targets().items():
                orig = cls.__dict__[name]
                _originals[key] = (cls, name, orig)
                setattr(cls, name, wrappers[key](orig))
        _listeners = (*_listeners, listener)
    return _Handle(listener)
