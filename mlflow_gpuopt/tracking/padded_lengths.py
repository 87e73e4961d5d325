"""The padded lengths a tracked run's batches ran at: its ``sequence_bins``.

A loader that pads each batch to its own longest sequence (Hugging Face's
``DataCollatorWithPadding``, ``group_by_length``, LDDL's binning) runs steps of several padded
lengths. The step clock adds each micro-batch's samples to a histogram of its token ids'
sequence dimension (a dict update per forward, shapes only: no copy, no synchronisation);
at stop :func:`observed_bins` turns it into the profile's ``sequence_bins``, in the format
the workload key takes (docs/metrics.md#artifacts-and-profilejson).
"""

from __future__ import annotations

#: Most padded lengths a profile's ``sequence_bins`` holds: beyond it the lengths are
#: coarsened (:func:`observed_bins`), so a prediction averages over at most this many.
MAX_OBSERVED_BINS = 16

#: The first multiple the coarsening rounds lengths up to (doubled until they fit): the
#: padding multiple of 8 that tensor-core kernels and LDDL's loader use.
FIRST_ROUNDING_TOKENS = 8


def observed_bins(samples_by_length: dict[int, int], max_bins: int = MAX_OBSERVED_BINS
                  ) -> tuple[tuple[int, float], ...] | None:
    """``((padded tokens, share of samples), ...)`` by length from a histogram of samples
    by padded length; None where the run had one length (or none).

    At most ``max_bins`` bins: with more distinct lengths each is rounded up to a multiple
    of ``g`` (8, 16, 32, …: the smallest that leaves at most ``max_bins``), capped at the
    longest observed length, which stays a bin of its own (it sets the memory plan).
    Rounding up keeps the mean padded length at or above the observed one."""
    counts = {int(t): int(n) for t, n in samples_by_length.items() if t > 0 and n > 0}
    if len(counts) < 2:
        return None
    longest = max(counts)
    step = FIRST_ROUNDING_TOKENS
    while len(counts) > max_bins:
        coarse: dict[int, int] = {}
        for t, n in counts.items():
            b = min(longest, -(-t // step) * step)
            coarse[b] = coarse.get(b, 0) + n
        if len(coarse) <= max_bins:
            counts = coarse
            break
        step *= 2
    total = sum(counts.values())
    return tuple((t, n / total) for t, n in sorted(counts.items()))


def mean_padded_tokens(samples_by_length: dict[int, int]) -> float | None:
    """Mean padded tokens per sample over the histogram (as observed, not coarsened); None
    where it is empty."""
    total = sum(n for t, n in samples_by_length.items() if t > 0 and n > 0)
    if not total:
        return None
    return sum(t * n for t, n in samples_by_length.items() if t > 0 and n > 0) / total
