"""Reading a user's file with a size limit: a huge or endless file (``/dev/zero``, a FIFO that
never ends) is refused after the limit is read, instead of being read until memory runs out.
"""

from __future__ import annotations

import os

#: Bytes read at a time: memory follows the file's size, not the limit.
_PIECE_BYTES = 1 << 20


def read_capped(path: str | os.PathLike, cap_bytes: int) -> bytes:
    """The bytes of ``path``, read until its end or until more than ``cap_bytes`` came (then
    ``cap_bytes`` + 1 bytes come back: the caller says the file is too large). Raises
    ``OSError`` as ``open`` does."""
    parts: list[bytes] = []
    got = 0
    with open(path, "rb") as fh:
        while got <= cap_bytes:
            piece = fh.read(min(_PIECE_BYTES, cap_bytes + 1 - got))
            if not piece:
                break
            parts.append(piece)
            got += len(piece)
    return b"".join(parts)
