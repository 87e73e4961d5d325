"""The published LLM training table the LLM benchmarks read (``data/llm_training_throughput.tsv``,
a copy of ``shared/data/``'s; its README says what each column holds), and the two readers
of its cells that ``bench_llm.py``, ``bench_proxy.py`` and ``bench_memory.py`` share."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "llm_training_throughput.tsv"


def num(text: str | None) -> float | None:
    """A cell as a number; None for an empty, ``NA`` or missing one."""
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def note(notes: str, key: str) -> str | None:
    """The value of ``key=value`` in a row's ``;``-separated notes, or None."""
    for part in notes.split(";"):
        part = part.strip()
        if part.lower().startswith(key + "="):
            return part.split("=", 1)[1].strip()
    return None


def tp_comm_overlap(source: str, notes: str, tp: int) -> bool | None:
    """Whether a row's runs overlap tensor-parallel communication with the GEMMs (None
    without tensor parallelism): NVIDIA's stacks do (Megatron-LM's README: "overlap of DP/TP/PP
    comm"; NeMo's launcher configs ``ub_tp_comm_overlap: True``, e.g. NeMo-Framework-Launcher
    ``conf/training/gpt3/175b.yaml``; Megatron-Bridge's performance recipes
    ``CommOverlapConfig(tp_comm_overlap=True)``); torchtitan's only in its "AsyncTP" variants
    (vanilla TP waits on each collective)."""
    if tp <= 1:
        return None
    if not source.startswith("torchtitan"):
        return True
    return "asynctp" in notes.replace(" ", "").lower()


def tp_overlap(source: str, notes: str, tp: int) -> str | None:
    """How a row's overlap is built, where it overlaps (``tp_comm_overlap``): torchtitan's
    async TP is PyTorch's over symmetric memory (``symm_mem``: torchtitan
    ``enable_async_tensor_parallel`` turns on inductor's ``_micro_pipeline_tp`` pass); the
    NVIDIA stacks run Transformer Engine's userbuffers (the model's default, so None)."""
    if tp_comm_overlap(source, notes, tp) and source.startswith("torchtitan"):
        return "symm_mem"
    return None


def attention_kernel(source: str) -> str | None:
    """The fused attention kernel a row's stack runs: NVIDIA's (Megatron-LM, NeMo,
    Megatron-Bridge) Transformer Engine's ``DotProductAttention``, cuDNN's fused attention on
    Hopper and Blackwell (``te``); torchtitan PyTorch SDPA, whose flash backend is
    FlashAttention-2 (None: the default, ``fa2``)."""
    return None if source.startswith("torchtitan") else "te"
