"""Parse and validate the catalog's CSV text into records, and write records back as CSV.

Pure functions over text: no file or network I/O here, so the shipped snapshot, a user's
cache and every refresher share one validator. Every problem is a :class:`CatalogError`
naming the file, the row (line number, header = 1) and the column.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import io
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from mlflow_gpuopt.catalog.errors import CatalogError, UnknownGpuError
from mlflow_gpuopt.catalog.gpu_names import resolve_gpu_in
from mlflow_gpuopt.catalog.schema import (
    GPU_COLUMNS,
    INTRA_NODE_LINKS,
    MAX_USD_PER_GPU_HOUR,
    OFFER_COLUMNS,
    PRICING_KINDS,
    PROVIDERS,
    GpuSpec,
    Offer,
)

#: GPU memory in a price row may differ this much (fraction) from the datasheet (MiB vs GB).
_MEMORY_TOLERANCE = 0.1


class _Row:
    """Typed access to one CSV row, turning every bad cell into a located CatalogError."""

    def __init__(self, cells: Mapping[str, str], file: str, line: int) -> None:
        self.cells = cells
        self.file = file
        self.line = line

    def fail(self, column: str | None, problem: str) -> CatalogError:
        return CatalogError(problem, file=self.file, row=self.line, column=column)

    def raw(self, col: str) -> str:
        value = self.cells.get(col)
        return "" if value is None else value.strip()

    def text(self, col: str, *, required: bool = True) -> str:
        value = self.raw(col)
        if required and not value:
            raise self.fail(col, "is empty")
        return value

    def _number(self, col: str, convert: Callable[[str], float], what: str) -> float | None:
        value = self.raw(col)
        if not value:
            return None
        try:
            out = convert(value)
        except (ValueError, OverflowError):
            raise self.fail(col, f"expected {what}, got {value!r}") from None
        if isinstance(out, float) and not math.isfinite(out):
            raise self.fail(col, f"expected a finite number, got {value!r}")
        return out

    def float_(self, col: str, *, required: bool = True, minimum: float | None = None,
               positive: bool = False) -> float | None:
        out = self._number(col, float, "a number")
        if out is None:
            if required:
                raise self.fail(col, "is empty")
            return None
        if positive and out <= 0:
            raise self.fail(col, f"must be positive, got {out:g}")
        if minimum is not None and out < minimum:
            raise self.fail(col, f"must be >= {minimum:g}, got {out:g}")
        return out

    def int_(self, col: str, *, minimum: int | None = None) -> int:
        out = self._number(col, _parse_int, "an integer")
        if out is None:
            raise self.fail(col, "is empty")
        if minimum is not None and out < minimum:
            raise self.fail(col, f"must be >= {minimum}, got {out}")
        return int(out)

    def bool_(self, col: str) -> bool:
        value = self.raw(col).lower()
        if value in ("true", "yes", "1"):
            return True
        if value in ("false", "no", "0"):
            return False
        raise self.fail(col, f"expected true or false, got {self.raw(col)!r}")

    def date(self, col: str) -> str:
        value = self.text(col)
        try:
            return _dt.date.fromisoformat(value).isoformat()
        except ValueError:
            raise self.fail(col, f"expected an ISO date (YYYY-MM-DD), got {value!r}") from None

    def choice(self, col: str, allowed: Sequence[str]) -> str:
        value = self.text(col).lower()
        if value not in allowed:
            raise self.fail(col, f"expected one of {', '.join(allowed)}, got {self.raw(col)!r}")
        return value

    def str_tuple(self, col: str) -> tuple[str, ...] | None:
        value = self.raw(col)
        if not value:
            return None
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if not isinstance(parsed, list) or not all(isinstance(x, str) for x in parsed):
            raise self.fail(col, f"expected a JSON list of strings, got {value!r}")
        return tuple(parsed)


def _parse_int(value: str) -> int:
    if not value.lstrip("+-").isdigit():
        raise ValueError(value)
    return int(value)


def _reader(text: str, file: str, columns: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    if not isinstance(text, str):
        raise CatalogError("is not text", file=file)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise CatalogError(f"unreadable CSV: {exc}", file=file, row=1) from None
    if header is None:
        raise CatalogError("is empty (no header row)", file=file, row=1)
    header = [h.strip() for h in header]
    missing = [c for c in columns if c not in header]
    if missing:
        raise CatalogError("missing from the header", file=file, row=1, column=missing[0])
    unknown = [h for h in header if h not in columns]
    if unknown:
        raise CatalogError("is not a catalog column", file=file, row=1, column=unknown[0])
    if len(set(header)) != len(header):
        dup = next(h for h in header if header.count(h) > 1)
        raise CatalogError("appears twice in the header", file=file, row=1, column=dup)
    try:
        for cells in reader:
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise CatalogError(
                    f"has {len(cells)} cells, the header has {len(header)}", file=file, row=line
                )
            yield line, dict(zip(header, cells, strict=True))
    except csv.Error as exc:
        raise CatalogError(f"unreadable CSV: {exc}", file=file, row=reader.line_num) from None


def parse_gpus_csv(text: str, file: str = "gpus.csv") -> dict[str, GpuSpec]:
    """Parse ``gpus.csv`` text into canonical name -> :class:`GpuSpec`."""
    specs: dict[str, GpuSpec] = {}
    for line, cells in _reader(text, file, GPU_COLUMNS):
        r = _Row(cells, file, line)
        name = r.text("name")
        if name.lower() in {n.lower() for n in specs}:
            raise r.fail("name", f"GPU {name!r} is listed twice")
        specs[name] = GpuSpec(
            name=name,
            memory_gb=r.float_("memory_gb", positive=True),
            memory_bandwidth_gb_per_s=r.float_("memory_bandwidth_gb_per_s", positive=True),
            fp32_tflops=r.float_("fp32_tflops", positive=True),
            tf32_tflops=r.float_("tf32_tflops", required=False, positive=True),
            fp16_tflops=r.float_("fp16_tflops", positive=True),
            bf16_tflops=r.float_("bf16_tflops", required=False, positive=True),
            fp8_tflops=r.float_("fp8_tflops", required=False, positive=True),
            nvlink_gb_per_s=r.float_("nvlink_gb_per_s", minimum=0.0),
            pcie_gen=r.int_("pcie_gen", minimum=1),
            tdp_w=r.float_("tdp_w", positive=True),
            source=r.text("source"),
            verification=r.text("verification", required=False),
        )
    if not specs:
        raise CatalogError("holds no GPUs", file=file)
    return specs


def parse_offers_csv(
    text: str, gpus: Mapping[str, GpuSpec], file: str, provider: str | None = None
) -> list[Offer]:
    """Parse and validate one offers CSV; ``provider`` (if given) must match every row."""
    offers: list[Offer] = []
    seen: dict[tuple[str, str, str], int] = {}
    for line, cells in _reader(text, file, OFFER_COLUMNS):
        offer = _parse_offer(_Row(cells, file, line), gpus, provider)
        key = (offer.provider, offer.instance_type, offer.region)
        if key in seen:
            raise CatalogError(
                f"{offer.instance_type} in {offer.region} is already on row {seen[key]}",
                file=file, row=line, column="instance_type",
            )
        seen[key] = line
        offers.append(offer)
    return offers


def _parse_offer(r: _Row, gpus: Mapping[str, GpuSpec], provider: str | None) -> Offer:
    prov = r.choice("provider", PROVIDERS)
    if provider is not None and prov != provider:
        raise r.fail("provider", f"expected {provider!r} in this file, got {prov!r}")
    try:
        gpu = resolve_gpu_in(r.text("gpu"), gpus, {k: v.memory_gb for k, v in gpus.items()})
    except UnknownGpuError as exc:
        raise r.fail("gpu", str(exc)) from None
    spec = gpus[gpu]
    count = r.int_("gpu_count", minimum=1)
    mem = r.float_("gpu_memory_gb", positive=True)
    if abs(mem - spec.memory_gb) > _MEMORY_TOLERANCE * spec.memory_gb:
        raise r.fail("gpu_memory_gb", f"{mem:g} GB per GPU, but {gpu} has {spec.memory_gb:g} GB")
    total = r.float_("total_gpu_memory_gb", positive=True)
    if abs(total - count * mem) > 0.5:
        raise r.fail(
            "total_gpu_memory_gb",
            f"{total:g} GB is not gpu_count x gpu_memory_gb = {count} x {mem:g} = {count * mem:g}",
        )
    price = r.float_("price_per_hour_usd", positive=True)
    if price / count > MAX_USD_PER_GPU_HOUR:
        raise r.fail("price_per_hour_usd",
                     f"{price / count:g} $/GPU-h is above the {MAX_USD_PER_GPU_HOUR:g} "
                     "sanity limit")
    spot = r.float_("spot_price_per_hour_usd", required=False, positive=True)
    if spot is not None and spot > price * 1.000001:
        raise r.fail("spot_price_per_hour_usd", f"spot {spot:g} is above on-demand {price:g}")
    link = r.choice("intra_node_link", INTRA_NODE_LINKS)
    link_bw = r.float_("intra_node_gb_per_s", minimum=0.0)
    if (link == "none") != (link_bw == 0):
        raise r.fail("intra_node_gb_per_s", f"{link_bw:g} GB/s does not fit link {link!r}")
    inter = r.float_("inter_node_gbps", minimum=0.0)
    max_nodes = r.int_("max_nodes", minimum=1)
    if max_nodes > 1 and inter <= 0:
        raise r.fail("inter_node_gbps", "must be positive where max_nodes > 1")
    pricing = r.choice("pricing", PRICING_KINDS)
    cu_h = r.float_("compute_units_per_hour", required=False, positive=True)
    usd_cu = r.float_("usd_per_compute_unit", required=False, positive=True)
    if pricing == "compute_units":
        if cu_h is None or usd_cu is None:
            col = "compute_units_per_hour" if cu_h is None else "usd_per_compute_unit"
            raise r.fail(col, "is required where pricing is compute_units")
        if abs(cu_h * usd_cu - price) > 0.01 * price:
            raise r.fail("price_per_hour_usd",
                         f"{price:g} is not compute_units_per_hour x usd_per_compute_unit "
                         f"= {cu_h * usd_cu:g}")
    elif cu_h is not None or usd_cu is not None:
        raise r.fail("compute_units_per_hour", "only allowed where pricing is compute_units")
    return Offer(
        provider=prov,
        instance_type=r.text("instance_type"),
        region=r.text("region"),
        gpu=gpu,
        gpu_count=count,
        gpu_memory_gb=mem,
        vcpus=r.int_("vcpus", minimum=1),
        memory_gb=r.float_("memory_gb", positive=True),
        price_per_hour_usd=price,
        spot_price_per_hour_usd=spot,
        billing_increment_s=r.int_("billing_increment_s", minimum=1),
        billing_minimum_s=r.int_("billing_minimum_s", minimum=0),
        intra_node_link=link,
        intra_node_gb_per_s=link_bw,
        inter_node_gbps=inter,
        inter_node_rdma=r.bool_("inter_node_rdma"),
        max_nodes=max_nodes,
        pricing=pricing,
        compute_units_per_hour=cu_h,
        usd_per_compute_unit=usd_cu,
        max_session_hours=r.float_("max_session_hours", required=False, positive=True),
        gpu_guaranteed=r.bool_("gpu_guaranteed"),
        as_of=r.date("as_of"),
        source=r.text("source"),
        regions_with_capacity=r.str_tuple("regions_with_capacity"),
        subscription_usd_per_month=r.float_("subscription_usd_per_month", required=False,
                                            minimum=0.0),
        compute_units_per_month=r.float_("compute_units_per_month", required=False, positive=True),
    )


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return json.dumps(list(value))
    if isinstance(value, float):
        return repr(value) if value != int(value) else str(int(value))
    return str(value)


def offers_to_csv(offers: Iterable[Offer]) -> str:
    """Serialise offers in the schema's column order (the inverse of :func:`parse_offers_csv`)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(OFFER_COLUMNS)
    for offer in offers:
        values = dataclasses.asdict(offer)
        values["total_gpu_memory_gb"] = offer.total_gpu_memory_gb
        writer.writerow([_cell(values[c]) for c in OFFER_COLUMNS])
    return buf.getvalue()
