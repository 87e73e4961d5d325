"""Writing a file so that a reader finds the old one or the new one, never a mix.

:func:`write_atomically` stages the text in a temporary file beside the target, synced to
disk, and moves it into place (``os.replace``; or a hard link where an existing file must not
be replaced). :func:`stage` and :func:`move_into_place` are its two halves, for a writer that
must know the file can be written before it goes on (``recommend --emit`` stages its artefact
before the recommendation is logged and moves it into place after).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def not_regular_file(path: Path) -> str | None:
    """What ``path`` is when it exists but is not a regular file (after symlinks): "a
    directory", "a FIFO", "a symlink loop or dangling symlink", ...; ``None`` when it is a
    regular file or absent."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a dangling symlink" if os.path.islink(path) else None
    except OSError as exc:  # ELOOP, EACCES on a folder above, ...
        return "a symlink loop" if os.path.islink(path) else f"unreadable ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "not a file"


def stage(path: Path, text: str, *, mode: int | None = None) -> Path:
    """Write ``text`` to a new temporary file beside ``path``, synced to disk (a full disk
    fails here), and return the temporary file's path.

    ``mode``: its permission bits; default those of the existing ``path`` (so others sharing
    the folder can still read it), else 0666 less the umask, as ``open`` would give.

    Raises:
        OSError: also when ``path`` exists but is not a regular file (a directory, a FIFO, a
            symlink loop): it is left alone.
    """
    kind = not_regular_file(path)
    if kind is not None:
        raise OSError(f"{path} is not a regular file ({kind}); left as it is")
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {path}")
    try:
        if mode is not None and hasattr(os, "fchmod"):
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def move_into_place(tmp: Path, path: Path, *, replace: bool = True) -> None:
    """Move the staged ``tmp`` to ``path``: ``os.replace``, or with ``replace`` False a hard
    link that fails with ``FileExistsError`` if ``path`` exists (the temporary file is then
    kept for the caller to remove)."""
    if replace:
        os.replace(tmp, path)
        return
    os.link(tmp, path)
    Path(tmp).unlink(missing_ok=True)


def write_atomically(path: Path, text: str, *, mode: int | None = None,
                     replace: bool = True) -> None:
    """Write ``text`` to ``path`` (folders created) via :func:`stage` and
    :func:`move_into_place`. A crash or error leaves either the old file or the new one, and
    no temporary file.

    Raises:
        OSError: as :func:`stage`; ``FileExistsError`` when ``replace`` is False and ``path``
            exists.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = stage(path, text, mode=mode)
    try:
        move_into_place(tmp, path, replace=replace)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
