"""Batches padded to their own longest sequence: a workload's per-sample compute over the
padded lengths it runs at (``Workload.sequence_bins``).

A data loader that pads each batch to its longest sequence (sequence binning: LDDL's BERT
pre-training loader, Hugging Face's ``DataCollatorWithPadding``, bucketing by length) runs
batches of several padded lengths; ``tokens_per_sample`` stays the longest (what must fit in
memory) and ``sequence_bins`` says which lengths run and how often. A step's per-sample time
is then the share-weighted mean of the per-sample time at each length: throughput in samples
per second is samples over summed time. At a length ``s`` below the longest ``S`` a sample's
FLOPs are ``flops_per_sample × ((1 − a)·s/S + a·(s/S)²)``, ``a`` attention's share at ``S``
(the linear layers grow with the tokens, attention's two batched matmuls with their square);
measured per-sample bytes scale as the architecture's activation formula does between the
two lengths (its ``s`` and ``s²`` terms), or with the tokens where the architecture is not
given. A tracked run's profile gives its figures at the profiled step's length, which may
be shorter than the longest bin: :func:`at_longest` scales them up by the same rules.
docs/models.md#padded-lengths-sequence_bins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from mlflow_gpuopt.perfmodel.types import Workload


def rescaled(workload: Workload, tokens: float, attention_share: float,
             bytes_ratio: float | None) -> Workload:
    """``workload`` as one sample padded to ``tokens`` costs, without bins: FLOPs ``× ((1 −
    a)·r + a·r²)`` with ``r`` the tokens' ratio to the workload's ``tokens_per_sample`` (the
    length its figures are at: the longest of a workload file, the profiled step's of a
    tracked run, which may be shorter) and ``a`` = ``attention_share`` there; measured
    per-sample bytes ``× bytes_ratio`` (the activation formula's ratio between the two
    lengths, None: ``r``). ``compute.at_length`` supplies both from the architecture."""
    plain = replace(workload, sequence_bins=None)
    reference = float(workload.tokens_per_sample or 0)
    if reference <= 0 or tokens == reference:
        return plain
    r = tokens / reference
    flops_scale = (1.0 - attention_share) * r + attention_share * r * r
    by = r if bytes_ratio is None else bytes_ratio

    def scaled(value: float | None, factor: float) -> float | None:
        return None if value is None else value * factor

    return replace(
        plain, tokens_per_sample=float(tokens),
        flops_per_sample=workload.flops_per_sample * flops_scale,
        activation_bytes_per_sample=scaled(workload.activation_bytes_per_sample, by),
        memory_traffic_bytes_per_sample=scaled(workload.memory_traffic_bytes_per_sample, by),
        matmul_traffic_bytes_per_sample=scaled(workload.matmul_traffic_bytes_per_sample, by),
        amp_traffic_bytes_per_sample=scaled(workload.amp_traffic_bytes_per_sample, by),
        amp_matmul_traffic_bytes_per_sample=scaled(
            workload.amp_matmul_traffic_bytes_per_sample, by),
        recompute_flops_per_sample=scaled(workload.recompute_flops_per_sample, flops_scale))


def at_longest(workload: Workload, at_length: Callable[[Workload, float], Workload]
               ) -> Workload:
    """A workload whose ``sequence_bins`` run longer than the ``tokens_per_sample`` its
    figures are at (a tracked run whose profiled step was not its longest) as it runs at the
    longest bin (``at_length``: ``compute.at_length``), bins kept: the longest batch sets the
    memory plan. Any other workload unchanged."""
    bins = workload.sequence_bins
    reference = workload.tokens_per_sample
    if not bins or not reference or max(t for t, _ in bins) <= reference:
        return workload
    return replace(at_length(workload, max(t for t, _ in bins)), sequence_bins=bins)


def binned(per_sample: Callable[[Workload], float], workload: Workload,
           at_length: Callable[[Workload, float], Workload]) -> float:
    """Share-weighted mean of ``per_sample`` (seconds per sample of one workload) over the
    workload's ``sequence_bins``, each at its padded length (``at_length``:
    ``compute.at_length``)."""
    bins = workload.sequence_bins or ()
    total = sum(share for _, share in bins)
    return sum(share * per_sample(at_length(workload, tokens))
               for tokens, share in bins) / total


def mean_padded_tokens(workload: Workload) -> float | None:
    """Mean padded tokens per sample over ``sequence_bins``; None without bins."""
    bins = workload.sequence_bins
    if not bins:
        return None
    return sum(t * s for t, s in bins) / sum(s for _, s in bins)


def notes(workload: Workload) -> tuple[str, ...]:
    """The prediction's note on the padded lengths it averaged over; () without bins."""
    mean = mean_padded_tokens(workload)
    if mean is None:
        return ()
    lengths = [t for t, _ in workload.sequence_bins or ()]
    return (f"sequence bins: {len(lengths)} padded lengths of {min(lengths):g}-"
            f"{max(lengths):g} tokens, mean {mean:.0f} (tokens_per_sample "
            f"{workload.tokens_per_sample:g}): the per-sample compute is their share-weighted "
            "mean, memory is planned for the longest",)
