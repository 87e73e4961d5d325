"""Reading a user's ``workload.json`` (or a Hugging Face ``config.json``:
:mod:`mlflow_gpuopt.hf_config`) and observations CSV into the models' records.

Every problem becomes a :class:`WorkloadFileError` (a ``ValueError``) whose message is one
line naming the file, the row or key, and what was expected, so the CLI can print it as is.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from mlflow_gpuopt.errors import InputError
from mlflow_gpuopt import contract
from mlflow_gpuopt.hf_config import HfConfigError, is_hf_config
from mlflow_gpuopt.hf_config import workload_doc as hf_workload_doc
from mlflow_gpuopt.bounded_read import read_capped
from mlflow_gpuopt.perfmodel.activations import normalize_attention, normalize_recompute
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.compute import (
    at_length,
    normalize_attention_kernel,
    normalize_fp8_recipe,
    normalize_memory_format,
    normalize_mixed_precision,
    normalize_optimizer_impl,
)
from mlflow_gpuopt.perfmodel.comm import normalize_tp_overlap
from mlflow_gpuopt.perfmodel.context import normalize_exchange
from mlflow_gpuopt.perfmodel.moe import (
    normalize_a2a_overlap,
    normalize_dispatcher,
    normalize_routing,
    routed_expert_params,
)
from mlflow_gpuopt.perfmodel.layout import parse_layout
from mlflow_gpuopt.perfmodel.precision import normalize_precision
from mlflow_gpuopt.perfmodel.sequence_bins import at_longest
from mlflow_gpuopt.perfmodel.types import Observation, Workload
from mlflow_gpuopt.validation import BOUNDS, OutOfRangeError, check, short_repr

REQUIRED_WORKLOAD_KEYS = ("params", "flops_per_sample", "precision")
OBSERVATION_COLUMNS = ("gpu", "gpu_count", "nodes", "micro_batch", "throughput_samples_per_s",
                       "strategy", "precision", "grad_accum", "recompute", "power_limit_w",
                       "moe_dispatcher", "moe_routing", "expert_tensor_parallel",
                       "moe_a2a_overlap")
#: A board power limit above this is a typo (the largest boards, B200 / MI325X, are 1,000 W).
MAX_POWER_LIMIT_W = 2000.0
REQUIRED_OBSERVATION_COLUMNS = ("gpu", "gpu_count", "throughput_samples_per_s")

_INT_KEYS = {"params", "micro_batch", "grad_accum", "trainable_params", "num_layers",
             "largest_layer_params", "hidden_size", "num_heads", "num_kv_heads", "vocab_size",
             "ffn_hidden_size", "num_experts", "experts_per_token", "num_shared_experts",
             "expert_ffn_hidden_size", "moe_layer_freq", "first_dense_layers",
             "num_expert_groups", "expert_groups_per_token", "expert_tensor_parallel",
             "qkv_width", "pp_microbatches", "optimizer_param_tensors", "sliding_window",
             "sliding_window_layers"}
_FLOAT_KEYS = {"flops_per_sample", "optimizer_state_bytes_per_param",
               "activation_bytes_per_sample", "tokens_per_sample",
               "memory_traffic_bytes_per_sample", "kernels_per_micro_step", "dropout",
               "recompute_flops_per_sample", "capacity_factor",
               "weight_traffic_bytes_per_micro_step", "matmul_traffic_bytes_per_sample",
               "gemm_reduction_per_micro_step", "amp_traffic_bytes_per_sample",
               "amp_matmul_traffic_bytes_per_sample", "nchw_conv_bytes_per_sample",
               "amp_kernels_per_micro_step"}
_STR_KEYS = {"name", "precision", "optimizer", "mlp", "attention", "recompute", "strategy",
             "fp8_recipe", "cross_entropy", "frozen_precision", "attention_kernel",
             "cp_exchange", "memory_format", "moe_dispatcher", "moe_routing", "tp_overlap",
             "mixed_precision", "optimizer_impl", "moe_a2a_overlap"}
_BOOL_KEYS = {"tp_comm_overlap", "fp8_all_gather", "grad_clip"}
#: Hugging Face ``config.json`` (``PretrainedConfig``) names of the architecture fields ->
#: the workload's; a workload file may use either, and the tracker reads a tracked model's
#: ``config`` by these names (:mod:`mlflow_gpuopt.tracking.architecture`).
HF_CONFIG_NAMES = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size",
                   "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
                   "intermediate_size": "ffn_hidden_size", "vocab_size": "vocab_size"}
#: Other spellings of workload keys.
_KEY_ALIASES = {"seq_len": "tokens_per_sample", "sequence_length": "tokens_per_sample",
                "num_local_experts": "num_experts", "num_experts_per_tok": "experts_per_token",
                "moe_intermediate_size": "expert_ffn_hidden_size",
                "first_k_dense_replace": "first_dense_layers",
                "n_group": "num_expert_groups", "topk_group": "expert_groups_per_token",
                "moe_router_num_groups": "num_expert_groups",
                "expert_tensor_parallel_size": "expert_tensor_parallel",
                "moe_router_group_topk": "expert_groups_per_token",
                "moe_token_dispatcher_type": "moe_dispatcher",
                "expert_parallel_comm_backend": "moe_dispatcher",
                "overlap_moe_expert_parallel_comm": "moe_a2a_overlap",
                **{hf: key for hf, key in HF_CONFIG_NAMES.items() if hf != key}}
_MLPS = ("gelu", "swiglu", "geglu", "gated", "glu")
_WORKLOAD_KEYS = {f.name for f in fields(Workload)}


#: Largest workload file read (bytes): a workload or Hugging Face config.json is a few KiB.
MAX_WORKLOAD_FILE_BYTES = 16 * 1024**2
#: Largest observations CSV read (bytes): a million rows of measurements is about 50 MiB.
MAX_OBSERVATIONS_BYTES = 64 * 1024**2
#: Longest CSV cell accepted (characters): far beyond any GPU name or layout.
MAX_CSV_FIELD_CHARS = 4096


class WorkloadFileError(InputError):
    """A workload or observations file that cannot be used; one line, names where."""


def read_text_capped(path: str | Path, cap_bytes: int, what: str) -> str:
    """The UTF-8 text of ``path`` (a byte-order mark dropped: Excel writes one), reading at
    most ``cap_bytes`` + 1 bytes: a larger file, or an endless one (``/dev/zero``, a FIFO
    that never ends), is one :class:`WorkloadFileError` instead of a read until memory runs
    out."""
    p = Path(path)
    try:
        data = read_capped(p, cap_bytes)
    except OSError as exc:
        raise WorkloadFileError(f"cannot read {what} file {p}: {exc.strerror or exc}") from None
    if len(data) > cap_bytes:
        raise WorkloadFileError(f"{p}: over the {cap_bytes // 1024**2} MiB limit for {what} "
                                "files (or a file that never ends)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise WorkloadFileError(f"{p}: not UTF-8 text (byte {exc.start})") from None


def _number(value: Any, key: str, where: str, cast: Callable[[float], Any]) -> Any:
    shown = short_repr(value)
    if isinstance(value, bool):
        raise WorkloadFileError(f"{where}: {key!r} must be a number, got {shown}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise WorkloadFileError(f"{where}: {key!r} must be a number, got {shown}") from None
    except OverflowError:  # an integer beyond float range: its range check says so
        number = math.inf
    if math.isnan(number) or number < 0:
        raise WorkloadFileError(f"{where}: {key!r} must be a finite number >= 0, got {shown}")
    if key in BOUNDS and number != 0:  # 0 means "unknown" for the optional counts
        try:
            check(key, value, where=where)
        except OutOfRangeError as exc:
            raise WorkloadFileError(str(exc)) from None
    if not math.isfinite(number):
        raise WorkloadFileError(f"{where}: {key!r} must be a finite number >= 0, got {shown}")
    if cast is int and number != int(number):
        raise WorkloadFileError(f"{where}: {key!r} must be a whole number, got {shown}")
    return cast(number)


#: Deeper JSON than this is not a workload (a profile is two levels deep); Python's parser
#: would recurse until RecursionError.
MAX_JSON_DEPTH = 64


def parse_json_document(text: str, where: str) -> Any:
    """``json.loads(text)``, with every way it can fail as one :class:`WorkloadFileError`
    line: invalid JSON, nesting deeper than :data:`MAX_JSON_DEPTH`, or an integer longer
    than Python converts (4300 digits)."""
    if _nesting_depth(text) > MAX_JSON_DEPTH:
        raise WorkloadFileError(f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadFileError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})"
                                ) from None
    except RecursionError:
        raise WorkloadFileError(f"{where}: JSON nested too deeply") from None
    except ValueError:  # int_max_str_digits: an integer of thousands of digits
        raise WorkloadFileError(f"{where}: a number in it has thousands of digits") from None


def _nesting_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting of JSON text, ignoring brackets inside strings (linear,
    no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def workload_from_dict(doc: Mapping[str, Any], where: str = "workload",
                       tracked_profile: bool = False) -> Workload:
    """A :class:`Workload` from a ``profile.json``/``workload.json`` document.

    Keys the models do not use (``schema``, ``hardware``...) are ignored; ``null`` values
    mean "unknown". Raises :class:`WorkloadFileError` for missing or malformed keys.
    ``tracked_profile`` (or a ``hardware`` object in ``doc``): a tracked run's profile, whose
    ``sequence_bins`` may run longer than the profiled step's ``tokens_per_sample``; the
    workload is then scaled to the longest bin (:func:`.sequence_bins.at_longest`).
    """
    if not isinstance(doc, Mapping):
        raise WorkloadFileError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    missing = [k for k in REQUIRED_WORKLOAD_KEYS if doc.get(k) in (None, "")]
    if missing:
        raise WorkloadFileError(
            f"{where}: missing required field(s) {', '.join(missing)} "
            f"(required: {', '.join(REQUIRED_WORKLOAD_KEYS)})")
    kwargs: dict[str, Any] = {}
    for raw_key, value in doc.items():
        key = _KEY_ALIASES.get(raw_key, raw_key)
        if key in doc and key != raw_key:
            continue  # the canonical key wins over its alias
        if key not in _WORKLOAD_KEYS or value is None:
            continue
        if key in _INT_KEYS:
            kwargs[key] = _number(value, key, where, int)
        elif key in _FLOAT_KEYS:
            kwargs[key] = _number(value, key, where, float)
        elif key in _STR_KEYS:
            if key == "moe_a2a_overlap" and isinstance(value, bool):
                value = "1f1b" if value else "none"  # Megatron-core's flag is a boolean
            if not isinstance(value, str):  # str() of a list would be read as a word
                raise WorkloadFileError(f"{where}: {key!r} must be text, got "
                                        f"{short_repr(value)}")
            kwargs[key] = value
        elif key == "sequence_bins":
            kwargs[key] = value  # checked once tokens_per_sample is known (_sequence_bins)
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise WorkloadFileError(f"{where}: {key!r} must be true or false, got "
                                        f"{short_repr(value)}")
            kwargs[key] = value
    if kwargs["params"] <= 0 or kwargs["flops_per_sample"] <= 0:
        raise WorkloadFileError(f"{where}: 'params' and 'flops_per_sample' must be positive")
    try:
        kwargs["precision"] = normalize_precision(kwargs["precision"])
    except PerfModelError as exc:
        raise WorkloadFileError(f"{where}: {exc}") from None
    _check_words(kwargs, where)
    # a tracked run's profile (its reader says so; a profile.json read as a file holds the
    # hardware it ran on) gives its figures at the profiled step's length, which its
    # observed bins may exceed: scaled up to the longest below
    profile = tracked_profile or isinstance(doc.get("hardware"), Mapping)
    if "sequence_bins" in kwargs:
        kwargs["sequence_bins"] = _sequence_bins(kwargs["sequence_bins"],
                                                 kwargs.get("tokens_per_sample"), where,
                                                 longer_allowed=profile)
    _check_kv_heads(kwargs, where)
    _check_window(kwargs, where)
    _check_moe(kwargs, where)
    if kwargs.get("micro_batch") == 0:
        kwargs.pop("micro_batch")
    if "grad_accum" in kwargs:
        kwargs["grad_accum"] = max(1, kwargs["grad_accum"])
    workload = at_longest(Workload(**kwargs), at_length)
    _check_expert_weights(workload, where)
    return workload


def _check_expert_weights(workload: Workload, where: str) -> None:
    """The routed experts' weights the architecture keys describe fit in ``params``: more
    would leave the dense part (and every size and time computed from it) negative."""
    routed = routed_expert_params(workload)
    if routed > workload.params:
        raise WorkloadFileError(
            f"{where}: the routed experts' weights ({routed:.3g}: MoE layers x "
            f"'num_experts' x 'hidden_size' x 'expert_ffn_hidden_size' x 3 matrices, 2 for "
            f"gelu) exceed 'params' ({workload.params:.3g}); fix the expert keys or 'params'")


def _word_normalisers() -> dict[str, Callable[[str], str]]:
    """Word-valued workload keys -> the function that spells each one canonically (and raises
    ``ValueError`` / ``PerfModelError`` for a word it does not know)."""
    return {"attention": normalize_attention, "recompute": normalize_recompute,
            "strategy": _strategy, "fp8_recipe": normalize_fp8_recipe,
            "attention_kernel": normalize_attention_kernel, "cp_exchange": normalize_exchange,
            "memory_format": normalize_memory_format, "moe_dispatcher": normalize_dispatcher,
            "moe_routing": normalize_routing, "tp_overlap": normalize_tp_overlap,
            "mixed_precision": normalize_mixed_precision,
            "optimizer_impl": normalize_optimizer_impl,
            "moe_a2a_overlap": normalize_a2a_overlap}


def _check_words(kwargs: dict[str, Any], where: str) -> None:
    """Normalise the workload's word-valued keys in place; one clear line when one is wrong."""
    try:
        for key, normalise in _word_normalisers().items():
            if key in kwargs:
                kwargs[key] = normalise(kwargs[key])
    except (ValueError, PerfModelError) as exc:
        raise WorkloadFileError(f"{where}: {exc}") from None
    if "mlp" in kwargs:
        kwargs["mlp"] = kwargs["mlp"].strip().lower()
        if kwargs["mlp"] not in _MLPS:
            raise WorkloadFileError(f"{where}: unknown mlp {kwargs['mlp']!r}; expected gelu or "
                                    "swiglu")
    if kwargs.get("fp8_all_gather") and kwargs.get("fp8_recipe") != "tensorwise":
        raise WorkloadFileError(f"{where}: 'fp8_all_gather' is torchao float8's FSDP all-gather "
                                "in FP8, which takes tensor-wise scaling only: it needs "
                                "'fp8_recipe' tensorwise")
    if kwargs.get("dropout") is not None and kwargs["dropout"] >= 1:
        raise WorkloadFileError(f"{where}: 'dropout' is a probability below 1, got "
                                f"{kwargs['dropout']!r}")


#: Most padded lengths ``sequence_bins`` takes (one per token position of a long context).
MAX_SEQUENCE_BINS = 4096


def _sequence_bins(value: Any, longest: float | None, where: str,
                   longer_allowed: bool = False) -> tuple[tuple[float, float], ...]:
    """``sequence_bins`` ({padded tokens: share or sample count}, or [[tokens, share], ...]) as
    ((tokens, share), ...) by length, shares normalised to sum to 1; each length above 0 and
    at most ``tokens_per_sample`` (the longest, which it needs; ``longer_allowed``: any
    length, a tracked profile's ``tokens_per_sample`` being its profiled step's), each share
    >= 0, some > 0."""
    key = "sequence_bins"
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
        pairs = [tuple(p) for p in value]
    else:
        raise WorkloadFileError(f"{where}: {key!r} must be an object of padded tokens -> share "
                                f"of samples (e.g. {{\"128\": 0.4, \"512\": 0.6}}), got "
                                f"{short_repr(value)}")
    if not pairs or len(pairs) > MAX_SEQUENCE_BINS:
        raise WorkloadFileError(f"{where}: {key!r} takes 1 to {MAX_SEQUENCE_BINS} padded "
                                f"lengths, got {len(pairs)}")
    if not longest:
        raise WorkloadFileError(f"{where}: {key!r} needs 'tokens_per_sample' (the longest "
                                "padded length, which sets memory)")
    bins: dict[float, float] = {}
    for tokens, share in pairs:
        t = _number(tokens, f"{key} length", where, float)
        w = _number(share, f"{key} share", where, float)
        if t <= 0 or (t > longest and not longer_allowed):
            raise WorkloadFileError(f"{where}: {key!r} lengths must be above 0 and at most "
                                    f"'tokens_per_sample' ({longest:g}), got {short_repr(tokens)}")
        bins[t] = bins.get(t, 0.0) + w
    total = sum(bins.values())
    if not math.isfinite(total):  # sample counts near 1e308 overflow their sum
        raise WorkloadFileError(f"{where}: {key!r} shares (or sample counts) sum beyond "
                                "float range; give shares of 1")
    if total <= 0:
        raise WorkloadFileError(f"{where}: {key!r} shares must not all be 0")
    if abs(total - 1.0) < 1e-9:  # already shares: kept as given (a round trip stays equal)
        total = 1.0
    return tuple((t, w / total) for t, w in sorted(bins.items()))


def _check_kv_heads(kwargs: dict[str, Any], where: str) -> None:
    """Grouped-query attention's key/value heads: at least 1, and dividing the query heads
    (each key/value head serves an equal group of them)."""
    kv = kwargs.get("num_kv_heads")
    if kv is None:
        return
    heads = kwargs.get("num_heads")
    if kv < 1:
        raise WorkloadFileError(f"{where}: 'num_kv_heads' must be >= 1, got {kv!r}")
    if not heads:
        raise WorkloadFileError(f"{where}: 'num_kv_heads' needs 'num_heads' (the query heads "
                                "it groups)")
    if heads % kv:
        raise WorkloadFileError(f"{where}: 'num_kv_heads' must divide 'num_heads' ({heads}), "
                                f"got {kv!r}")


def _check_window(kwargs: dict[str, Any], where: str) -> None:
    """Sliding-window layers: at most the layers, and only with a window to slide."""
    windowed, layers = kwargs.get("sliding_window_layers"), kwargs.get("num_layers")
    if windowed and not kwargs.get("sliding_window"):
        raise WorkloadFileError(f"{where}: 'sliding_window_layers' needs 'sliding_window' (the "
                                "tokens those layers attend to)")
    if windowed and layers and windowed > layers:
        raise WorkloadFileError(f"{where}: 'sliding_window_layers' ({windowed}) must be at "
                                f"most 'num_layers' ({layers})")


def _check_moe(kwargs: dict[str, Any], where: str) -> None:
    """Mixture-of-experts keys: top-k within the routed experts, which it needs; a capacity
    factor above 0. 0 or 1 experts is a dense model (the expert keys then say nothing)."""
    experts = kwargs.get("num_experts") or 0
    k = kwargs.get("experts_per_token")
    if k is not None and k > 0:
        if experts < 2:
            raise WorkloadFileError(f"{where}: 'experts_per_token' needs 'num_experts' (2 or "
                                    "more routed experts)")
        if k > experts:
            raise WorkloadFileError(f"{where}: 'experts_per_token' ({k}) must be at most "
                                    f"'num_experts' ({experts})")
    groups, per_token = kwargs.get("num_expert_groups"), kwargs.get("expert_groups_per_token")
    if groups is not None and groups > 1:
        if experts and experts % groups:
            raise WorkloadFileError(f"{where}: 'num_expert_groups' ({groups}) must divide "
                                    f"'num_experts' ({experts})")
        if per_token is not None and not 1 <= per_token <= groups:
            raise WorkloadFileError(f"{where}: 'expert_groups_per_token' ({per_token}) must be "
                                    f"1 to 'num_expert_groups' ({groups})")
        if per_token and k and experts and k > per_token * (experts // groups):
            raise WorkloadFileError(
                f"{where}: 'experts_per_token' ({k}) does not fit in "
                f"'expert_groups_per_token' ({per_token}) groups of {experts // groups}")
    etp = kwargs.get("expert_tensor_parallel")
    if etp is not None and etp < 1:
        raise WorkloadFileError(f"{where}: 'expert_tensor_parallel' must be >= 1, got {etp!r}")
    if kwargs.get("capacity_factor") == 0:
        raise WorkloadFileError(f"{where}: 'capacity_factor' must be above 0 (1.0: each "
                                "expert takes its even share of tokens)")
    if kwargs.get("moe_layer_freq") == 0:
        kwargs.pop("moe_layer_freq")
    first, layers = kwargs.get("first_dense_layers"), kwargs.get("num_layers")
    if first and layers and first >= layers:
        raise WorkloadFileError(f"{where}: 'first_dense_layers' ({first}) must be below "
                                f"'num_layers' ({layers}): a MoE model has a MoE layer")
    freq = kwargs.get("moe_layer_freq")
    if experts > 1 and freq and layers and freq > layers - (first or 0):
        raise WorkloadFileError(f"{where}: 'moe_layer_freq' ({freq}) must be at most the "
                                f"{layers - (first or 0)} layers after 'first_dense_layers': "
                                "a MoE model has a MoE layer")


def _strategy(text: str) -> str:
    """The strategy string as given (lower case, no spaces) once :func:`parse_layout` accepts
    it: ``ddp``, ``fsdp``, ``tp2xfsdp``, ``tp8xpp12xddp``..."""
    cleaned = "".join(str(text).split()).lower()
    parse_layout(cleaned)
    return cleaned



@dataclass(frozen=True)
class WorkloadInput:
    """A workload as read from a file, with what reading it derived or assumed, in words
    (a ``config.json``'s parameter count and FLOPs, the precision it defaulted to)."""

    workload: Workload
    notes: tuple[str, ...] = ()
    hf_config: bool = False  # True: read from a Hugging Face config.json


def read_workload(path: str | Path, *, seq_len: int | None = None) -> WorkloadInput:
    """Read ``workload.json``, or a Hugging Face ``config.json`` (told apart by its keys:
    :func:`mlflow_gpuopt.hf_config.is_hf_config`) trained at ``seq_len`` tokens per sample.

    A ``config.json`` without ``seq_len``, or ``seq_len`` with a workload file (which states
    its own ``tokens_per_sample`` and the FLOPs that go with it), is a
    :class:`WorkloadFileError`.
    """
    p = Path(path)
    text = read_text_capped(p, MAX_WORKLOAD_FILE_BYTES, "workload")
    doc = parse_json_document(text, str(p))
    if not is_hf_config(doc):
        if seq_len is not None:
            raise WorkloadFileError(
                f"{p}: --seq-len goes with a Hugging Face config.json; a workload file states "
                "tokens_per_sample (and the flops_per_sample that go with it)")
        return WorkloadInput(workload_from_dict(doc, where=str(p)))
    if seq_len is None:
        raise WorkloadFileError(
            f"{p} is a Hugging Face config.json: give the training sequence length with "
            "--seq-len N (max_position_embeddings is the longest it can take, not what it "
            "trains on)")
    try:
        check("tokens_per_sample", seq_len, where="--seq-len", label="the sequence length")
    except OutOfRangeError as exc:
        raise WorkloadFileError(str(exc)) from None
    name = doc.get("_name_or_path")
    if not isinstance(name, str) or not name.strip():
        name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    try:
        converted, notes = hf_workload_doc(doc, int(seq_len), name=name.strip(), where=str(p))
    except HfConfigError as exc:
        raise WorkloadFileError(str(exc)) from None
    return WorkloadInput(workload_from_dict(converted, where=str(p)), notes, hf_config=True)


def load_workload(path: str | Path) -> Workload:
    """Read ``workload.json`` (see :func:`workload_from_dict`)."""
    return read_workload(path).workload


def parse_observations_csv(text: str, where: str = "observations",
                           resolve_gpu: Callable[[str], str] | None = None) -> list[Observation]:
    """Observations from CSV text with the columns of ``OBSERVATION_COLUMNS``.

    ``strategy`` takes every layout ``--strategy`` does (``fsdp``, ``tp2xfsdp``,
    ``tp8xpp12xddp``, ``pp4xvp2``...); ``recompute`` is none, selective or full (empty: the
    workload's own); ``moe_dispatcher`` and ``moe_routing`` the run's own MoE token
    dispatcher and routing, ``expert_tensor_parallel`` its experts' tensor-parallel degree,
    ``moe_a2a_overlap`` its all-to-all overlap (1f1b or none) (empty: the workload's).

    ``resolve_gpu`` maps NVML/short names to canonical ones (``cpu`` is kept as ``cpu``); a
    ``ValueError`` it raises is reported with the row.
    """
    try:
        return _parse_observations(text.removeprefix("\ufeff"), where, resolve_gpu)
    except csv.Error as exc:  # a cell over csv's field limit, a NUL byte...
        raise WorkloadFileError(f"{where}: not a readable CSV ({exc})") from None


def _parse_observations(text: str, where: str,
                        resolve_gpu: Callable[[str], str] | None) -> list[Observation]:
    body = text.lstrip("\r\n")  # blank lines above the header: the header is the first line
    skipped = text[:len(text) - len(body)].count("\n")
    reader = csv.DictReader(io.StringIO(body))
    header = [h.strip() for h in (reader.fieldnames or [])]
    twice = sorted({h for h in header if h and header.count(h) > 1})
    if twice:  # DictReader would keep the last cell and drop the other silently
        raise WorkloadFileError(f"{where}: column(s) {', '.join(twice)} given twice")
    for h in header:  # a misspelt column would be read as absent: the default, silently
        close = difflib.get_close_matches(h, OBSERVATION_COLUMNS, n=1, cutoff=0.85)
        if h not in OBSERVATION_COLUMNS and close:
            raise WorkloadFileError(f"{where}: unknown column {h!r}; did you mean "
                                    f"{close[0]!r}? (columns: {', '.join(OBSERVATION_COLUMNS)})")
    missing = [c for c in REQUIRED_OBSERVATION_COLUMNS if c not in header]
    if missing:
        raise WorkloadFileError(
            f"{where}: missing column(s) {', '.join(missing)} "
            f"(columns: {', '.join(OBSERVATION_COLUMNS)})")
    out: list[Observation] = []
    for line, raw in enumerate(reader, start=2 + skipped):
        at = f"{where}, row {line}"
        if None in raw:  # csv.DictReader files surplus cells under the key None
            raise WorkloadFileError(f"{at}: more cells than the header has columns")
        if any(len(v or "") > MAX_CSV_FIELD_CHARS for v in raw.values()):
            raise WorkloadFileError(f"{at}: a cell longer than {MAX_CSV_FIELD_CHARS} "
                                    "characters")
        row = {k.strip(): (v or "").strip() for k, v in raw.items()}
        if not any(row.values()):
            continue
        for c in REQUIRED_OBSERVATION_COLUMNS:
            if not row.get(c):
                raise WorkloadFileError(f"{at}: empty {c!r}")
        gpu = row["gpu"]
        if gpu.lower() != "cpu" and resolve_gpu is not None:
            try:
                gpu = resolve_gpu(gpu)
            except ValueError as exc:
                raise WorkloadFileError(f"{at}: {exc}") from None
        elif gpu.lower() == "cpu":
            gpu = "cpu"
        count = _number(row["gpu_count"], "gpu_count", at, int)
        nodes = _number(row["nodes"], "nodes", at, int) if row.get("nodes") else 1
        thr = _number(row["throughput_samples_per_s"], "throughput_samples_per_s", at, float)
        if count < 1 or nodes < 1 or thr <= 0:
            raise WorkloadFileError(
                f"{at}: gpu_count and nodes must be >= 1 and throughput_samples_per_s > 0")
        try:
            strategy = _strategy(row.get("strategy") or ("single" if count == 1 else "ddp"))
            recompute = normalize_recompute(row["recompute"]) if row.get("recompute") else None
        except (ValueError, PerfModelError) as exc:
            raise WorkloadFileError(f"{at}: {exc}") from None
        power = None
        if row.get("power_limit_w"):
            power = _number(row["power_limit_w"], "power_limit_w", at, float)
            if not 0 < power <= MAX_POWER_LIMIT_W:
                raise WorkloadFileError(f"{at}: power_limit_w must be a board power limit in W, "
                                        f"> 0 and <= {MAX_POWER_LIMIT_W:g}, got {power:g}")
        precision = None
        if row.get("precision"):
            try:
                precision = normalize_precision(row["precision"])
            except PerfModelError as exc:
                raise WorkloadFileError(f"{at}: {exc}") from None
        try:
            dispatcher = (normalize_dispatcher(row["moe_dispatcher"])
                          if row.get("moe_dispatcher") else None)
            routing = normalize_routing(row["moe_routing"]) if row.get("moe_routing") else None
            a2a = (normalize_a2a_overlap(row["moe_a2a_overlap"])
                   if row.get("moe_a2a_overlap") else None)
        except ValueError as exc:
            raise WorkloadFileError(f"{at}: {exc}") from None
        if a2a == "auto":
            raise WorkloadFileError(f"{at}: moe_a2a_overlap auto: a measured run ran the 1F1B "
                                    "overlap or did not; say 1f1b or none")
        etp = None
        if row.get("expert_tensor_parallel"):
            etp = _number(row["expert_tensor_parallel"], "expert_tensor_parallel", at, int)
            if etp < 1:
                raise WorkloadFileError(f"{at}: expert_tensor_parallel must be >= 1")
            tp = parse_layout(strategy)[1] or count // nodes  # tp alone: the node's GPUs
            if tp % etp:
                raise WorkloadFileError(f"{at}: expert_tensor_parallel {etp} must divide the "
                                        f"row's tensor-parallel degree tp{tp} (strategy "
                                        f"{strategy})")
        out.append(Observation(
            gpu=gpu, gpu_count=count, throughput_samples_per_s=thr, nodes=nodes,
            micro_batch=_number(row["micro_batch"], "micro_batch", at, int)
            if row.get("micro_batch") else None,
            strategy=strategy, precision=precision, recompute=recompute,
            grad_accum=max(1, _number(row["grad_accum"], "grad_accum", at, int))
            if row.get("grad_accum") else 1, power_limit_w=power,
            moe_dispatcher=dispatcher, moe_routing=routing, expert_tensor_parallel=etp,
            moe_a2a_overlap=a2a))
    if not out:
        raise WorkloadFileError(f"{where}: no observations (only a header?)")
    return out


def load_observations(path: str | Path, resolve_gpu: Callable[[str], str] | None = None
                      ) -> list[Observation]:
    """Read an observations CSV (see :func:`parse_observations_csv`)."""
    p = Path(path)
    text = read_text_capped(p, MAX_OBSERVATIONS_BYTES, "observations")
    return parse_observations_csv(text, where=str(p), resolve_gpu=resolve_gpu)


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """The ``workload.json`` document of ``workload`` (unknown fields left out), which
    :func:`workload_from_dict` reads back to an equal :class:`Workload`."""
    doc: dict[str, Any] = {"schema": contract.PROFILE_SCHEMA}
    for f in fields(Workload):
        value = getattr(workload, f.name)
        if value is not None:
            doc[f.name] = [list(b) for b in value] if f.name == "sequence_bins" else value
    return doc


def observations_to_csv(observations: list[Observation]) -> str:
    """CSV text with the columns of ``OBSERVATION_COLUMNS``, which
    :func:`parse_observations_csv` reads back."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(OBSERVATION_COLUMNS)
    for o in observations:
        writer.writerow([o.gpu, o.gpu_count, o.nodes, o.micro_batch or "",
                         repr(float(o.throughput_samples_per_s)), o.strategy, o.precision or "",
                         o.grad_accum, o.recompute or "",
                         "" if o.power_limit_w is None else repr(float(o.power_limit_w)),
                         o.moe_dispatcher or "", o.moe_routing or "",
                         o.expert_tensor_parallel or "", o.moe_a2a_overlap or ""])
    return out.getvalue()
