"""The one base of every input error: what the user gave (a flag, a file, a run, a catalog)
cannot be used, and the message says why in one line.

The command-line group maps an :class:`InputError` to one line on stderr and exit code 2
(``cli/__init__.py``); any other exception is a bug and surfaces as a traceback. It is a
``ValueError`` so that library callers catching that keep working.
"""

from __future__ import annotations


class InputError(ValueError):
    """Input that cannot be used; the message is one line naming the input."""


__all__ = ["InputError"]
