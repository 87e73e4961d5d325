"""One resolver from every spelling of a GPU (NVML, torch, provider APIs, benchmarks) to the
catalog's canonical name.

Names are compared as a *set of tokens*, case-insensitively: vendor words (``NVIDIA``,
``Tesla``, ``GeForce``, ``RTX``…), instance counts (``8x``) and the word ``gpu`` are dropped,
``16 GB`` becomes ``16gb`` and every SXM generation (``SXM2``, ``SXM4``, ``SXM5``), ``HBM3``
(only the SXM H100 has it) and GCP's ``mega`` mean "SXM". So ``NVIDIA A100-SXM4-40GB``,
``A100-40GB-SXM4``, ``gpu_8x_a100_80gb_sxm4`` and ``A100 (40 GB SXM4)`` all resolve.

A name may leave out the memory or the form factor when only one catalog GPU fits. Where
several fit, :data:`SHORT_NAME_DEFAULTS` decides (``A100`` is the original 40 GB SXM4,
``V100`` the 16 GB SXM2, ``H100`` and ``H100 SXM5`` the 80 GB SXM5, not the 96 GB part of
Meta's Grand Teton hosts): these are what GCP's ``nvidia-tesla-a100``, a
bare ``V100`` or ``H100`` mean at the providers in the catalog. ``V100-32GB-SXM3`` (DGX-2's
part, ~5% higher clocks) resolves to ``V100-SXM2-32GB``, its closest catalog part.

AMD names drop ``AMD``, ``Instinct`` and ``OAM`` (the only form factor of the MI300X/MI325X,
as AMD SMI's ``market_name`` may spell it), so ``AMD Instinct MI300X`` and
``AMD Instinct MI300X OAM`` both resolve to ``MI300X``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from functools import lru_cache

from mlflow_gpuopt.catalog.errors import UnknownGpuError

_NOISE = frozenset(
    {"nvidia", "tesla", "geforce", "rtx", "quadro", "amd", "instinct", "gpu", "tensor", "core",
     "oam"}
)
_FORM_SYNONYMS = {"sxm2": "sxm", "sxm3": "sxm", "sxm4": "sxm", "sxm5": "sxm", "sxm6": "sxm",
                  "hbm3": "sxm",
                  "mega": "sxm"}
_MEM = re.compile(r"^\d+gb$")
_FORMS = frozenset({"sxm", "pcie"})

#: Short names that fit several catalog GPUs -> the one meant (documented in the module doc).
SHORT_NAME_DEFAULTS = {
    "a100": "A100-40GB-SXM4",
    "a100 40gb": "A100-40GB-SXM4",
    "a100 sxm": "A100-40GB-SXM4",
    "a100 80gb": "A100-80GB-SXM4",
    "a100 pcie": "A100-40GB-PCIe",
    "v100": "V100-SXM2-16GB",
    "v100 sxm": "V100-SXM2-16GB",
    "h100": "H100-SXM5-80GB",
    "h100 80gb": "H100-SXM5-80GB",
    "h100 sxm": "H100-SXM5-80GB",
}


def tokens(name: str) -> frozenset[str]:
    """The comparison key of a GPU name: its meaningful lower-case tokens."""
    text = re.sub(r"(\d+)\s*gb\b", r"\1gb", name.lower())
    out = set()
    for tok in re.split(r"[^a-z0-9]+", text):
        if not tok or tok in _NOISE or re.fullmatch(r"\d+x", tok):
            continue
        out.add(_FORM_SYNONYMS.get(tok, tok))
    return frozenset(out)


def _key(toks: Iterable[str]) -> str:
    return " ".join(sorted(toks))


@lru_cache(maxsize=8)
def build_alias_table(canonical_names: tuple[str, ...]) -> dict[str, str]:
    """Map every accepted token key to a canonical name (ambiguous keys only via defaults)."""
    candidates: dict[str, set[str]] = {}
    for name in canonical_names:
        toks = tokens(name)
        mem = {t for t in toks if _MEM.match(t)}
        form = toks & _FORMS
        model = toks - mem - form
        for m in (mem, set()):
            for f in (form, set()):
                candidates.setdefault(_key(model | m | f), set()).add(name)
        # "A10G-24GB", "T4 16GB": a memory token on a name that has none is still that GPU.
        if not mem:
            candidates.setdefault(_key(toks | {"__mem__"}), set()).add(name)
    table = {k: next(iter(v)) for k, v in candidates.items() if len(v) == 1}
    for key, name in SHORT_NAME_DEFAULTS.items():
        if name in canonical_names:
            table[_key(key.split())] = name
    return table


def resolve_gpu_in(name: str, canonical_names: Iterable[str], memory_gb: dict[str, float]) -> str:
    """Resolve ``name`` against ``canonical_names`` (see the module doc for the rules).

    ``memory_gb`` (canonical -> GB) lets a redundant memory token (``L4-24GB``) be checked.
    Raises:
        UnknownGpuError: no catalog GPU fits; the message lists the closest known names.
    """
    names = tuple(sorted(canonical_names))
    if not isinstance(name, str) or not name.strip():
        raise UnknownGpuError(str(name), list(names[:5]))
    by_lower = {n.lower(): n for n in names}
    if name.strip().lower() in by_lower:
        return by_lower[name.strip().lower()]
    table = build_alias_table(names)
    toks = tokens(name)
    hit = table.get(_key(toks))
    if hit is None:
        mem = {t for t in toks if _MEM.match(t)}
        if len(mem) == 1:
            cand = table.get(_key((toks - mem) | {"__mem__"}))
            gb = float(next(iter(mem))[:-2])
            if cand is not None and abs(memory_gb.get(cand, -1.0) - gb) <= 1.0:
                hit = cand
    if hit is not None:
        return hit
    raise UnknownGpuError(name, closest_names(name, names) or list(names))


def closest_names(name: str, canonical_names: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` canonical names most like ``name`` (difflib on the token keys; a shared
    model token such as ``h100`` counts most)."""
    toks = tokens(name)
    key = _key(toks)

    def score(canon: str) -> float:
        ctoks = tokens(canon)
        ratio = difflib.SequenceMatcher(None, key, _key(ctoks)).ratio()
        shared = {t for t in toks & ctoks if not _MEM.match(t) and t not in _FORMS}
        return ratio + (1.0 if shared else 0.0)

    ranked = sorted(canonical_names, key=lambda c: (-score(c), c))
    return [c for c in ranked[:n] if score(c) >= 0.3]
