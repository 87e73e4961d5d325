"""Which dimension of the tracked model's input holds the samples.

Most models take batch-major inputs, ``(batch, ...)``. Sequence models written in PyTorch's
own default convention take time-major ones, ``(sequence, batch, ...)``: ``nn.RNN``/``LSTM``/
``GRU``, ``nn.MultiheadAttention`` and ``nn.Transformer*`` all default to
``batch_first=False``, and Transformer-XL (the original code, NVIDIA DeepLearningExamples')
feeds ``(tgt_len, batch)`` token ids, its segment length in the model's ``tgt_len``. Counted
along the first dimension, such a step's samples are its tokens. The model says which
convention it uses (:func:`sample_dim`); nothing is guessed from the sizes, which can be
equal (a batch of 192 segments of 192 tokens).
"""

from __future__ import annotations

from typing import Any

#: Inputs of at most this many dimensions can be time-major: token ids ``(sequence, batch)``
#: and feature sequences ``(sequence, batch, features)``. An image or spectrogram batch
#: (4-D) is batch-major even where recurrent layers after its convolutions are not.
TIME_MAJOR_MAX_DIMS = 3


def sample_dim(model: Any) -> int:
    """1 where ``model`` declares time-major inputs, else 0: its own ``batch_first`` where it
    has one (a bool); else 1 where it has an integer ``tgt_len`` (Transformer-XL's segment
    length) or where it holds modules with a ``batch_first`` attribute and every one of
    them is False; else 0."""
    if model is None:
        return 0
    own = getattr(model, "batch_first", None)
    if isinstance(own, bool):
        return 0 if own else 1
    tgt_len = getattr(model, "tgt_len", None)
    if isinstance(tgt_len, int) and not isinstance(tgt_len, bool) and tgt_len > 0:
        return 1
    flags = [m.batch_first for m in model.modules()
             if m is not model and isinstance(getattr(m, "batch_first", None), bool)]
    return 1 if flags and not any(flags) else 0


def samples_in(x: Any, dim: int) -> int:
    """Samples in a forward's input tensor ``x`` (at least one dimension) whose samples lie
    along ``dim`` (:func:`sample_dim`); a tensor with too few or too many dimensions for
    ``dim`` 1 counts along its first."""
    if dim == 1 and 2 <= x.dim() <= TIME_MAJOR_MAX_DIMS:
        return int(x.shape[1])
    return int(x.shape[0])


def sequence_length_of(ids: Any, dim: int) -> int:
    """Tokens per sample of a 2-D batch of token ids whose samples lie along ``dim``."""
    return int(ids.shape[0] if dim == 1 else ids.shape[1])
