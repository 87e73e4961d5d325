"""Accuracy of the scaling models against NVIDIA's published training throughput.

Data: ``benchmarks/data/nvidia_dle_benchmarks.csv`` (a copy of the DeepLearningExamples README
tables, each row citing its README). Workload files: ``benchmarks/workloads/*.json``,
written from each model's published size, FLOPs and shape (their ``bench.notes`` say how),
holding only keys docs/metrics.md marks user-supplied (``tests/test_benchmark_workloads.py``).
Every prediction is ``mlflow gpuopt predict`` on that file, invoked in-process
(``cli_path.run_predict``), with an observations CSV of the given rows; a DGX-2's 16 GPUs per
node are two nodes of 8 on the command line (no catalog machine holds 16). A convolutional
network's ``memory_format`` is the one DeepLearningExamples runs each precision in
(:func:`memory_format`: ResNet-50 channels-last in AMP only, per ConvNets' ``configs.yml``).

Tasks (each prints median and p90 absolute % error per model and overall, interval coverage,
a naive baseline, and in the summary the median interval width, high / low):
  1a. scaling within a GPU type: given the 1-GPU row, predict 4, 8 and 16 GPUs;
  1b. the same given the 1- and 2-GPU rows (where a table has 2 GPUs);
  1d. BERT-large (pre-training at seq 128/512, SQuAD fine-tuning) DDP on one 8-GPU DGX-1 /
      DGX A100 node, given the 1-GPU row: 1a's BERT rows at 8 GPUs, whose error is that of the
      predicted scaling efficiency (the csv's ``scaling_efficiency`` 0.89-0.99);
  1c. multi-node: given 8 GPUs (one node), predict 16-256 (BERT/Transformer-XL tables);
  2.  across GPU types: given one type's 1-GPU row, predict the other type's 1-GPU rows
      (V100 <-> A100; fp32 <-> tf32 and amp <-> amp);
  3.  no GPU measurement (the CPU-only case): every 1-GPU row from the profile alone; 3a the
      transformers described by their architecture (BERT), 3b the others (FLOPs and a shape).

With ``--tracked [--models a,b]`` it also trains the models ``tracked_profiles.py`` builds
for three CPU steps under ``gpuopt.track()`` (a temporary sqlite store; ~7 minutes for all
on one thread, most of it Tacotron 2, BERT-large, WaveGlow and Transformer-XL large, whose
profiled CPU step held 18-24 GB when OOM-killed on a shared 23 GB machine) and
adds the tracked path's tasks beside tasks 3 and 2 on the same rows: 3t, no GPU run,
``predict --run-id`` with the row's batch and precision (with its leave-one-model-out width
check), and 2t, the GPU row with the run's ``profile.json`` as the workload file.
``--store DIR`` keeps that store (and ``DIR/runs.json``, the run of each model) in DIR;
``--reuse`` beside it scores the runs DIR already holds instead of tracking them again;
``--dump FILE`` writes tasks 3t's and 2t's rows as JSON (to pool the runs of several stores).


Run: ``python benchmarks/bench_accuracy.py`` (a few seconds, CPU only); ``--explain-width``
prints, per task, the pieces each interval combines (``predict --json``'s ``width_terms``)
grouped by which were assumed, with each group's RMS log error and coverage;
``--profile-figures`` runs every task with the profile's figures the files' notes give
(activations, kernels per micro-step: what a CPU-tracked run's profile adds to the card).
With ``--lomo`` it also derives the same-precision cross-GPU piece (net of the other pieces
its intervals add) and checks it and task 3's width leave-one-model-out, and reports task 2
leave-one-model-out: the global constants of the compute model (tensor/SIMT efficiency,
traffic hidden under matmuls, fixed share of latency-bound work) are picked from a small
grid on the other models and each model is scored with the pick made without it (~20 s).
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cli_path import observations_args, run_predict
from scores import explain_widths

from mlflow_gpuopt.catalog import load_gpus
from mlflow_gpuopt.hardware import hardware_for_gpu
from mlflow_gpuopt.perfmodel import Hardware, ParallelConfig, fit
from mlflow_gpuopt.perfmodel.precision import peak_flops_per_s
from mlflow_gpuopt.workload_files import workload_from_dict

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "nvidia_dle_benchmarks.csv"

#: The DGX systems behind the tables: catalog spec, GPUs per node, NVLink/NVSwitch GB/s per
#: GPU (total, both directions), node network Gbit/s (InfiniBand HCAs per node).
SYSTEMS = {
    "A100-80GB-SXM4": ("A100-80GB-SXM4", 8, 600.0, 1600.0),   # DGX A100: 8x HDR 200 Gb/s
    "A100-40GB-SXM4": ("A100-40GB-SXM4", 8, 600.0, 1600.0),
    "V100-16GB-SXM2": ("V100-SXM2-16GB", 8, 300.0, 400.0),    # DGX-1: NVLink cube mesh, 4x EDR
    "V100-32GB-SXM2": ("V100-SXM2-32GB", 8, 300.0, 400.0),
    "V100-32GB-SXM3": ("V100-SXM2-32GB", 16, 300.0, 800.0),   # DGX-2(H): NVSwitch, 8x EDR
}
FAMILY = {"fp32": "fp32", "tf32": "fp32", "amp_fp16": "amp"}
PRECISION = {"fp32": "fp32", "tf32": "tf32", "amp_fp16": "fp16"}


def hardware() -> dict[str, Hardware]:
    specs = load_gpus()
    out = {}
    for name, (spec_name, per_node, nvlink, ib_gbps) in SYSTEMS.items():
        hw = hardware_for_gpu(specs[spec_name], gpus_per_node=per_node)
        out[name] = Hardware(gpu=name, memory_bytes=hw.memory_bytes,
                             memory_bandwidth_bytes_per_s=hw.memory_bandwidth_bytes_per_s,
                             peak_flops_per_s=hw.peak_flops_per_s,
                             intra_node_bytes_per_s=nvlink / 2 * 1e9,
                             inter_node_bytes_per_s=ib_gbps / 8 * 1e9, gpus_per_node=per_node)
    return out


@dataclass(frozen=True)
class Row:
    model: str
    precision: str  # table spelling: fp32 | tf32 | amp_fp16
    gpu: str
    gpus: int
    throughput: float
    micro_batch_items: int
    grad_accum: int
    group: tuple
    multinode_table: bool


def _accum(r: dict, micro: int) -> int:
    text = (r.get("accum_batch_per_gpu") or "").split(" ")[0]
    if text.isdigit() and micro:
        return max(1, round(int(text) / micro))
    return 1


def load_rows() -> list[Row]:
    rows = []
    with DATA.open() as f:
        for r in csv.DictReader(f):
            note = r["note"]
            micro = int(float(r["batch_size_if_known"]))
            accum = _accum(r, micro)
            if "accumulated (global) batch" in note:
                # V100 BERT tables give the accumulated batch only; the DLE configs use
                # micro-batches of 64 (seq128) / 8 (seq512) on 32 GB V100s (assumption).
                per = 64 if "seq128" in r["model"] else 8
                accum, micro = max(1, micro // per), per
            multinode = "multi-node" in note
            strong = r["scaling_type"] == "strong" or "strong scaling" in note
            key = (r["model"], r["precision"], r["gpu"], r["table_id"], multinode,
                   r["global_batch"] if strong else micro)
            rows.append(Row(r["model"], r["precision"], r["gpu"], int(r["gpu_count"]),
                            float(r["throughput"]), micro, accum, key, multinode))
    return rows


#: Keys of a workload file that describe the file, not the workload (the loader ignores them).
METADATA_KEYS = ("schema", "bench")


def workload_docs() -> dict[str, dict]:
    """Each benchmark workload file's workload keys (without ``METADATA_KEYS``), by name: what
    the predictions read (``tests/test_benchmark_workloads.py`` checks they are all
    user-supplied)."""
    out = {}
    for path in sorted((HERE / "workloads").glob("*.json")):
        doc = json.loads(path.read_text())
        out[doc["name"]] = {k: v for k, v in doc.items() if k not in METADATA_KEYS}
    return out


#: The profile's figures a file's ``bench.notes`` give and a model card does not
#: (``--profile-figures`` puts them in the workload, as a CPU-tracked run's profile would).
PROFILE_KEYS = ("activation_bytes_per_sample", "kernels_per_micro_step")


def profile_figures(doc: dict) -> dict:
    """``PROFILE_KEYS`` from a workload file's notes ("figures a model card does not give
    (KEY VALUE, ...)"), by key."""
    match = re.search(r"figures a model card does not give \(([^)]*)\)", doc["bench"]["notes"])
    out = {}
    for part in (match.group(1).split(",") if match else []):
        key, _, value = part.strip().partition(" ")
        if key in PROFILE_KEYS:
            out[key] = float(value)
    return out


def workloads(with_profile: bool = False) -> dict[str, tuple]:
    """(the workload file's path, units per batch item, the :class:`Workload` it holds), by
    name; ``with_profile`` adds the notes' profile figures (:func:`profile_figures`), each
    file then rewritten to a temporary folder for the command to read."""
    out = {}
    for path in sorted((HERE / "workloads").glob("*.json")):
        doc = json.loads(path.read_text())
        if with_profile:
            doc.update(profile_figures(doc))
            path = _tmp() / path.name
            path.write_text(json.dumps(doc))
        out[doc["name"]] = (path, doc["bench"]["units_per_batch_item"],
                            workload_from_dict(doc, str(path)))
    return out


def memory_format(path: Path, precision: str) -> str | None:
    """The memory format DeepLearningExamples runs ``path``'s model in at ``precision`` (the
    table's spelling): the file's ``bench.memory_format_by_precision`` where it has one (the
    run's layout differs by precision: ConvNets' ``configs.yml`` sets ``memory_format: nhwc``
    under AMP only, so its FP32 and TF32 rows run PyTorch's default NCHW), else the file's
    own ``memory_format``. How the user ran each row, as a user knows it."""
    doc = json.loads(path.read_text())
    by_precision = doc["bench"].get("memory_format_by_precision", {})
    return by_precision.get(precision, doc.get("memory_format"))


def optimizer_args(wl, model: str) -> list[str]:
    """``--optimizer-impl`` as DeepLearningExamples' code steps ``model``'s optimizer on the
    GPU (the file's ``bench.optimizer_impl``, with its source in ``bench.optimizer_source``:
    ``torch.optim`` in the tables' PyTorch 1.x containers loops over the parameter tensors,
    apex's fused optimizers do not), or nothing where the file does not say. How the user ran
    each row, as a user knows it; the tracked CPU run resolves PyTorch 2's default."""
    impl = json.loads(Path(wl[model][0]).read_text())["bench"].get("optimizer_impl")
    return ["--optimizer-impl", impl] if impl else []


def mixed_precision_args(wl, model: str) -> list[str]:
    """``--mixed-precision apex_o1`` where DeepLearningExamples runs ``model``'s 16-bit rows
    under apex AMP O1 (the file's ``mixed_precision``: Tacotron 2, WaveGlow), else nothing.
    How the user ran each row, as a user knows it; a CPU run cannot show it, and the flag
    states all of it. Transformer-XL's apex O2 (``master_weights``) goes with LAMB and
    clipping, which ``predict --run-id`` has no flags for: stated alone it would take O2's
    16-bit traffic without the optimizer bytes that come with it, so this task reads that run
    as tracked and the cross-GPU one lays all three over the profile (``RUN_KEYS``)."""
    mode = json.loads(Path(wl[model][0]).read_text()).get("mixed_precision")
    return ["--mixed-precision", mode] if mode == "apex_o1" else []


def workload_path(path: Path, precision: str) -> Path:
    """``path`` itself, or a copy in the temporary folder with ``memory_format`` set to how
    the rows at ``precision`` ran (:func:`memory_format`) where that differs from the file's."""
    doc = json.loads(path.read_text())
    fmt = memory_format(path, precision)
    if fmt == doc.get("memory_format"):
        return path
    copy = _tmp() / f"{path.stem}.{precision}.json"
    if not copy.exists():
        copy.write_text(json.dumps({**doc, "memory_format": fmt}))
    return copy


def config(row: Row, units: int) -> ParallelConfig:
    per_node = SYSTEMS[row.gpu][1]
    nodes = max(1, math.ceil(row.gpus / per_node))
    return ParallelConfig(gpus_per_node=row.gpus // nodes, nodes=nodes,
                          strategy="single" if row.gpus == 1 else "ddp",
                          micro_batch=row.micro_batch_items * units, grad_accum=row.grad_accum,
                          precision=PRECISION[row.precision])


@dataclass
class Result:
    model: str
    error: float  # |pred - actual| / actual
    covered: bool
    baseline_error: float
    width: float = math.nan  # high / low of the 90% interval
    label: str = ""
    log_error: float = math.nan  # log(published / predicted)
    width_terms: tuple = ()  # predict --json's width_terms
    log_sigma: float = math.nan
    family: str = ""  # the row's precision family (FAMILY): fp32 (FP32, TF32) or amp


_TMP: list[Path] = []


def _store() -> Path:
    """Where the tracked runs' sqlite store and ``runs.json`` live: ``--store DIR``, or the
    temporary folder. Scratch files (observations, workload copies) stay in the latter, so
    several scorings of one store (``--reuse``) do not write over each other's."""
    if "--store" in sys.argv[1:]:
        store = Path(sys.argv[sys.argv.index("--store") + 1]).resolve()
        store.mkdir(parents=True, exist_ok=True)
        return store
    return _tmp()


def _tmp() -> Path:
    if not _TMP:
        _TMP.append(Path(tempfile.mkdtemp(prefix="bench_accuracy_")))
    return _TMP[0]


def nodes_for_cli(row: Row) -> int:
    """Nodes as the command takes them: 8 GPUs per node at most (no catalog machine holds a
    DGX-2's 16 V100s), so its 16-GPU rows are two nodes on the DGX-2's 8 EDR links each."""
    return max(1, math.ceil(row.gpus / 8))


def observation_line(row: Row, units: int) -> list:
    nodes = nodes_for_cli(row)
    return [SYSTEMS[row.gpu][0], row.gpus, nodes, row.micro_batch_items * units,
            row.throughput, "single" if row.gpus == 1 else "ddp", PRECISION[row.precision],
            row.grad_accum, ""]


def cli_predict(path: Path, units: int, given: list[Row], t: Row) -> dict:
    """``mlflow gpuopt predict --workload PATH [--observations CSV] ... --json`` for ``t``,
    with the file's ``memory_format`` as ``t``'s precision ran (:func:`workload_path`; the
    given rows ran in the same one)."""
    formats = {memory_format(path, r.precision) for r in [*given, t]}
    if len(formats) > 1:
        raise ValueError(f"{path.name}: the given rows and {t} ran in different memory "
                         f"formats {sorted(map(str, formats))}")
    args = ["--workload", str(workload_path(path, t.precision))]
    if given:
        args += observations_args(_tmp() / "observations.csv",
                                  (observation_line(r, units) for r in given))
    args += ["--gpu", SYSTEMS[t.gpu][0], "--gpus", str(t.gpus), "--nodes", str(nodes_for_cli(t)),
             "--strategy", "single" if t.gpus == 1 else "ddp",
             "--micro-batch", str(t.micro_batch_items * units),
             "--grad-accum", str(t.grad_accum), "--precision", PRECISION[t.precision],
             "--inter-node-gbps", str(SYSTEMS[t.gpu][3] / (2 if SYSTEMS[t.gpu][1] > 8 else 1))]
    return run_predict(args)


def predict_rows(wl, given: list[Row], targets: list[Row], hw, baseline) -> list[Result]:
    path, units, _ = wl
    out = []
    for t in targets:
        p = cli_predict(path, units, given, t)
        src = ", ".join(f"{r.gpus}x{r.gpu} {r.precision}" for r in given) or "workload alone"
        out.append(Result(t.model, abs(p["throughput_samples_per_s"] / t.throughput - 1),
                          p["low"] <= t.throughput <= p["high"],
                          abs(baseline(given, t) / t.throughput - 1), p["high"] / p["low"],
                          f"{t.model} {t.gpus}x{t.gpu} {t.precision} from [{src}]",
                          math.log(t.throughput / p["throughput_samples_per_s"]),
                          tuple(p["width_terms"]), p["log_sigma"]))
    return out


def linear_baseline(given: list[Row], t: Row) -> float:
    ref = min(given, key=lambda r: r.gpus)
    return ref.throughput * t.gpus / ref.gpus


def task_scaling(rows, wl, hw, given_counts: tuple[int, ...], targets: tuple[int, ...],
                 multinode: bool) -> list[Result]:
    groups = defaultdict(list)
    for r in rows:
        if r.multinode_table == multinode:
            groups[r.group].append(r)
    out = []
    for members in groups.values():
        by_count = {r.gpus: r for r in members}
        if not all(c in by_count for c in given_counts):
            continue
        tgt = [r for r in members if r.gpus in targets and r.gpus not in given_counts]
        if not tgt:
            continue
        out += predict_rows(wl[members[0].model], [by_count[c] for c in given_counts], tgt,
                            hw, linear_baseline)
    return out


def task_cross_gpu(rows, wl, hw) -> list[Result]:
    hwmap = hw

    def peak_baseline(given: list[Row], t: Row) -> float:
        src = given[0]
        ratio = (peak_flops_per_s(hwmap[t.gpu].peak_flops_per_s, PRECISION[t.precision])
                 / peak_flops_per_s(hwmap[src.gpu].peak_flops_per_s, PRECISION[src.precision]))
        return src.throughput * ratio

    singles = [r for r in rows if r.gpus == 1 and not r.multinode_table]
    out = []
    for src in singles:
        for t in singles:
            if (t.model != src.model or FAMILY[t.precision] != FAMILY[src.precision]
                    or t.gpu[:4] == src.gpu[:4]):
                continue
            out += predict_rows(wl[src.model], [src], [t], hw, peak_baseline)
    return out


def described(workload) -> bool:
    """Whether a workload file describes a transformer's architecture (layers, hidden size,
    sequence, heads, vocabulary): what the models derive every term from."""
    return bool(workload.num_layers and workload.hidden_size and workload.tokens_per_sample
                and workload.num_heads and workload.vocab_size)


def task_prior_only(rows, wl, hw, which=None) -> list[Result]:
    """Task 3: every 1-GPU row from its workload file alone; ``which`` True keeps the
    described transformers only, False the others, None all."""
    out = []
    for t in rows:
        if t.gpus != 1 or t.multinode_table:
            continue
        if which is not None and described(wl[t.model][2]) != which:
            continue
        def no_baseline(given, row):
            return math.nan

        out += predict_rows(wl[t.model], [], [t], hw, no_baseline)
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    idx = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))
    return 100 * s[idx]


def report(title: str, results: list[Result], baseline_name: str) -> dict:
    print(f"\n== {title} ({len(results)} predictions)")
    print(f"{'model':28s} {'n':>3s} {'median%':>8s} {'p90%':>7s} {'cover':>6s} "
          f"{'width':>6s} {'base med%':>9s} {'base p90%':>9s}")
    by_model = defaultdict(list)
    for r in results:
        by_model[r.model].append(r)
    for model in sorted(by_model) + ["ALL"]:
        rs = results if model == "ALL" else by_model[model]
        errs = [r.error for r in rs]
        base = [r.baseline_error for r in rs if not math.isnan(r.baseline_error)]
        cover = 100 * sum(r.covered for r in rs) / len(rs) if rs else math.nan
        w = [r.width for r in rs if not math.isnan(r.width)]
        print(f"{model:28s} {len(rs):3d} {100 * statistics.median(errs):8.1f} "
              f"{_pct(errs, 0.9):7.1f} {cover:5.0f}% "
              f"{statistics.median(w) if w else math.nan:5.2f}x "
              f"{(100 * statistics.median(base)) if base else math.nan:9.1f} "
              f"{_pct(base, 0.9):9.1f}")
    errs = [r.error for r in results]
    widths = [r.width for r in results if not math.isnan(r.width)]
    summary = {"n": len(results), "median_pct": 100 * statistics.median(errs) if errs else None,
               "p90_pct": _pct(errs, 0.9),
               "coverage_pct": 100 * sum(r.covered for r in results) / max(1, len(results)),
               "width": statistics.median(widths) if widths else math.nan}
    print(f"   baseline: {baseline_name}")
    if "--explain-width" in sys.argv[1:]:
        for line in explain_widths(title.split(":")[0], [
                (r.label, r.log_error, list(r.width_terms), r.log_sigma) for r in results]):
            print(line)
    return summary


# -- the tracked path: a CPU run's profile (``--tracked``) ------------------------------------
def tracked_runs(models: list[str]) -> dict[tuple[str, str | None], str]:
    """Run ids of CPU training runs of ``models`` tracked by ``gpuopt.track()`` into a sqlite
    store in the temporary folder (``tracked_profiles.py``), by (model, memory format)."""
    import os

    import mlflow
    import tracked_profiles

    os.environ["GPUOPT_JOURNAL_DIR"] = str(_store() / "journal")
    # MLflow's download progress bar would land in predict's captured --json output
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    mlflow.set_tracking_uri(f"sqlite:///{_store()}/tracked.db")
    index = _store() / "runs.json"  # (model|memory format) -> run id, kept with --store
    kept = json.loads(index.read_text()) if "--reuse" in sys.argv[1:] and index.exists() else {}
    out = {}
    for name in models:
        for job in tracked_profiles.JOBS[name]:
            key = f"{name}|{job.memory_format}"
            if key not in kept and mlflow.get_experiment_by_name("tracked") is None:
                # the runs' artifacts inside the store, wherever the script runs from
                mlflow.create_experiment("tracked", (_store() / "artifacts").as_uri())
            if key not in kept:
                mlflow.set_experiment("tracked")
            out[(name, job.memory_format)] = kept.get(key) or tracked_profiles.track_job(job)
    if index.exists():
        kept = json.loads(index.read_text())
    kept.update({f"{m}|{f}": run for (m, f), run in out.items()})
    index.write_text(json.dumps(kept, indent=1))
    return out


def _run_for(runs: dict, wl, t: Row) -> str | None:
    """The tracked run of ``t``'s model in the memory format ``t``'s precision ran in."""
    fmt = memory_format(wl[t.model][0], t.precision)
    return runs.get((t.model, fmt)) or runs.get((t.model, None))


#: Workload keys that say how DeepLearningExamples trains a model on its GPUs and that a
#: CPU run does not show (its replica in ``tracked_profiles`` runs torch's Adam in fp32, where
#: DLE's Transformer-XL runs LAMB with gradient clipping under apex AMP O2): taken from the
#: model's workload file, as a user states how the job runs beside the run's profile.
RUN_KEYS = ("optimizer", "grad_clip", "mixed_precision")


def _profile_file(run_id: str, card: Path | None = None) -> Path:
    """The run's ``gpuopt/profile.json``, downloaded into the temporary folder, with the
    ``RUN_KEYS`` the workload file ``card`` states over it: the workload file of a
    prediction from GPU rows with the run's profile."""
    import mlflow

    stated = ({k: v for k, v in json.loads(card.read_text()).items() if k in RUN_KEYS}
              if card is not None else {})
    suffix = f".{card.stem}" if stated else ""
    target = _tmp() / f"profile-{run_id}{suffix}.json"
    if not target.exists():
        doc = mlflow.artifacts.load_dict(f"runs:/{run_id}/gpuopt/profile.json")
        target.write_text(json.dumps({**doc, **stated}))
    return target


def _target_args(t: Row) -> list[str]:
    """The target flags of a 1-GPU row on the tracked path: the row's GPU, batch (in the
    run's samples: batch items) and precision."""
    return ["--gpu", SYSTEMS[t.gpu][0], "--gpus", "1", "--nodes", "1", "--strategy", "single",
            "--micro-batch", str(t.micro_batch_items), "--grad-accum", str(t.grad_accum),
            "--precision", PRECISION[t.precision]]


def _tracked_result(t: Row, units: int, p: dict) -> Result:
    actual = t.throughput / units  # the run's samples are batch items (clips, sentences)
    return Result(t.model, abs(p["throughput_samples_per_s"] / actual - 1),
                  p["low"] <= actual <= p["high"], math.nan, p["high"] / p["low"],
                  log_error=math.log(actual / p["throughput_samples_per_s"]),
                  family=FAMILY[t.precision])


def print_precision_gap(results: list[Result]) -> None:
    """Per model: mean log(published / predicted) of its mixed-precision rows, of its
    FP32/TF32 rows, and the difference (AMP minus FP32): what a precision change the model
    misses leaves."""
    by = defaultdict(lambda: defaultdict(list))
    for r in results:
        by[r.model][r.family].append(r.log_error)
    for model in sorted(by):
        amp, fp32 = by[model].get("amp"), by[model].get("fp32")
        if not amp or not fp32:
            continue
        a, f = statistics.fmean(amp), statistics.fmean(fp32)
        print(f"  {model:28s} AMP {a:+.3f} ({len(amp)})  FP32/TF32 {f:+.3f} ({len(fp32)})  "
              f"AMP - FP32 {a - f:+.3f}")


def task_tracked_prior(rows, wl, runs) -> list[Result]:
    """No GPU run, the CPU run's profile: ``predict --run-id RUN`` for every 1-GPU row of the
    tracked models, with the row's batch and precision."""
    out = []
    for t in rows:
        if t.gpus != 1 or t.multinode_table or _run_for(runs, wl, t) is None:
            continue
        p = run_predict(["--run-id", _run_for(runs, wl, t), *_target_args(t),
                         *optimizer_args(wl, t.model), *mixed_precision_args(wl, t.model)])
        out.append(_tracked_result(t, wl[t.model][1], p))
    return out


def task_tracked_cross_gpu(rows, wl, runs) -> list[Result]:
    """Task 2 on the tracked path: one GPU type's 1-GPU row as the observation, the CPU run's
    ``profile.json`` as the workload file (``predict --workload profile.json --observations
    CSV``) with the model's workload file's ``RUN_KEYS`` over it, the other type's 1-GPU rows
    predicted."""
    singles = [r for r in rows if r.gpus == 1 and not r.multinode_table]
    out = []
    for src in singles:
        for t in singles:
            if (t.model != src.model or FAMILY[t.precision] != FAMILY[src.precision]
                    or t.gpu[:4] == src.gpu[:4] or _run_for(runs, wl, t) is None
                    or memory_format(wl[t.model][0], t.precision)
                    != memory_format(wl[t.model][0], src.precision)):
                continue
            units = wl[t.model][1]
            obs = observations_args(
                _tmp() / "tracked_observations.csv",
                [observation_line(replace(src, throughput=src.throughput / units), 1)])
            p = run_predict(["--workload", str(_profile_file(_run_for(runs, wl, t),
                                                             wl[t.model][0])), *obs,
                             *_target_args(t), *optimizer_args(wl, t.model)])
            out.append(_tracked_result(t, units, p))
    return out


def _print_lomo_coverage(logs: dict[str, list[float]], per_class: dict[str, float],
                         digits: int) -> None:
    """For each model held out: the width is the root-mean-square of the other models'
    ``per_class`` figure (each model weighted once), and how many of the held-out model's
    log errors fall inside ±1.645 of it; then the coverage over every row."""
    from mlflow_gpuopt.perfmodel.uncertainty import Z90

    covered = 0
    for held in sorted(logs):
        width = math.sqrt(statistics.fmean(c * c for m, c in per_class.items() if m != held))
        inside = sum(abs(x) <= Z90 * width for x in logs[held])
        covered += inside
        print(f"  without {held:28s} width {width:.{digits}f}, mean log error "
              f"{statistics.fmean(logs[held]):+.{digits}f}, covers {inside}/{len(logs[held])}")
    print(f"  leave-one-model-out coverage "
          f"{100 * covered / sum(len(v) for v in logs.values()):.1f}%")


def lomo_tracked_prior_width(results: list[Result], wl) -> None:
    """Task 3t's interval width leave-one-model-out, for the tracked models that are not
    transformers described by their architecture (those keep their own width): for each, the
    root-mean-square of log(published / predicted) over the other models (each weighted
    once) as the width, and how many of its rows fall inside ±1.645 of it."""
    logs = defaultdict(list)
    for r in results:
        if not described(wl[r.model][2]):
            logs[r.model].append(r.log_error)
    if len(logs) < 2:
        print("  fewer than two such models tracked: nothing to leave out")
        return
    every = [x for v in logs.values() for x in v]
    per_class = {m: math.sqrt(statistics.fmean(x * x for x in v)) for m, v in logs.items()}
    print(f"  RMS log(published / predicted): "
          f"{math.sqrt(statistics.fmean(x * x for x in every)):.3f} over {len(every)} rows, "
          f"{math.sqrt(statistics.fmean(c * c for c in per_class.values())):.3f} per class")
    _print_lomo_coverage(logs, per_class, digits=3)


def tracked_models(argv: list[str]) -> list[str] | None:
    """``--tracked [--models a,b]``: the models to track on the CPU (default: all that
    ``tracked_profiles.JOBS`` builds), or None without ``--tracked``."""
    if "--tracked" not in argv:
        return None
    import tracked_profiles

    if "--models" in argv:
        names = argv[argv.index("--models") + 1].split(",")
        unknown = [n for n in names if n not in tracked_profiles.JOBS]
        if unknown:
            raise SystemExit(f"unknown --models {','.join(unknown)}; known: "
                             f"{','.join(tracked_profiles.JOBS)}")
        return names
    return list(tracked_profiles.JOBS)


#: The grid the shipped constants were chosen from (compute.py); --lomo reruns the choice.
LOMO_GRID = [(tc, simt, hidden, fixed) for tc in (0.45, 0.6, 0.75) for simt in (0.6, 0.85)
             for hidden in (0.0, 0.5) for fixed in (0.0, 0.5)]


def lomo_cross_gpu(rows, wl, hw) -> list[Result]:
    """Task 2 with the compute constants chosen leave-one-model-out."""
    from mlflow_gpuopt.perfmodel import compute, fitting

    saved = (compute.COMPUTE_EFFICIENCY_TENSOR, compute.COMPUTE_EFFICIENCY_SIMT,
             compute.MATMUL_HIDDEN_TRAFFIC_SHARE, fitting.LATENCY_FIXED_SHARE)
    by_setting = {}
    try:
        for setting in LOMO_GRID:
            (compute.COMPUTE_EFFICIENCY_TENSOR, compute.COMPUTE_EFFICIENCY_SIMT,
             compute.MATMUL_HIDDEN_TRAFFIC_SHARE, fitting.LATENCY_FIXED_SHARE) = setting
            by_setting[setting] = task_cross_gpu(rows, wl, hw)
    finally:
        (compute.COMPUTE_EFFICIENCY_TENSOR, compute.COMPUTE_EFFICIENCY_SIMT,
         compute.MATMUL_HIDDEN_TRAFFIC_SHARE, fitting.LATENCY_FIXED_SHARE) = saved
    models = sorted({r.model for r in by_setting[LOMO_GRID[0]]})
    out = []
    for held in models:
        def score(setting, held=held):  # used at once by min(), bound for clarity
            errs = [r.error for r in by_setting[setting] if r.model != held]
            return statistics.median(errs) + 0.3 * _pct(errs, 0.9) / 100
        best = min(LOMO_GRID, key=score)
        print(f"  without {held:28s} picks tensor {best[0]}, simt {best[1]}, "
              f"hidden traffic {best[2]}, fixed latency share {best[3]}")
        out += [r for r in by_setting[best] if r.model == held]
    return out


def lomo_prior_width(rows, wl, hw) -> None:
    """Task 3's interval width checked leave-one-model-out: for each workload class, the
    root-mean-square of log(measured / prior) over the other classes (each class weighted
    once) as the width, and whether the held-out class's rows fall inside ±1.645 of it."""
    from mlflow_gpuopt.perfmodel.uncertainty import SIGMA_PRIOR_ONLY

    logs = defaultdict(list)
    for t in rows:
        if t.gpus != 1 or t.multinode_table:
            continue
        path, units, w = wl[t.model]
        w = replace(w, memory_format=memory_format(path, t.precision))
        p = fit(w, [], hw).predict(config(t, units), hw[t.gpu])
        logs[t.model].append(math.log(t.throughput / p.throughput_samples_per_s))
    means = {m: statistics.fmean(v) for m, v in logs.items()}
    every = [x for v in logs.values() for x in v]
    rms_rows = math.sqrt(statistics.fmean(x * x for x in every))
    rms_classes = math.sqrt(statistics.fmean(v * v for v in means.values()))
    print(f"  RMS log(measured / prior): {rms_rows:.2f} over {len(every)} rows, "
          f"{rms_classes:.2f} per class; shipped width {SIGMA_PRIOR_ONLY}")
    _print_lomo_coverage(logs, means, digits=2)


def pair_logs(rows, wl, keep, term: str) -> dict[str, list[tuple[float, float]]]:
    """Per model: (log(published / predicted), the variance of the interval's pieces other
    than ``term``) of each 1-GPU row predicted from another 1-GPU row of the same model where
    ``keep(source, target)``, through the CLI path (:func:`cli_predict`)."""
    logs = defaultdict(list)
    singles = [r for r in rows if r.gpus == 1 and not r.multinode_table]
    for src in singles:
        for t in singles:
            if t.model != src.model or not keep(src, t):
                continue
            path, units, _ = wl[src.model]
            p = cli_predict(path, units, [src], t)
            logs[t.model].append((math.log(t.throughput / p["throughput_samples_per_s"]),
                                  sum(w["log_sigma"] ** 2 for w in p["width_terms"]
                                      if w["term"] != term)))
    return logs


def lomo_other_gpu_width(rows, wl, hw) -> None:
    """``uncertainty.SIGMA_OTHER_GPU_SAME_PRECISION`` derived and checked leave-one-model-out
    over the amp <-> amp transfers of task 2: the RMS of log(published / predicted), net of
    the other pieces the same intervals add (fit, micro-batch, carried defaults: the mean of
    their variances taken out of the mean squared error); then for each workload class that
    net piece from the other classes' rows, with each held-out row's own other pieces, and
    how many of the held-out class's rows fall inside ±1.645 of it."""
    from mlflow_gpuopt.perfmodel.uncertainty import SIGMA_OTHER_GPU_SAME_PRECISION, TERM_OTHER_GPU

    logs = pair_logs(rows, wl, lambda src, t: (
        FAMILY[t.precision] == FAMILY[src.precision] == "amp" and t.gpu[:4] != src.gpu[:4]),
        TERM_OTHER_GPU)

    def net(pairs) -> float:
        return math.sqrt(max(0.0, statistics.fmean(e * e - r for e, r in pairs)))

    every = [x for v in logs.values() for x in v]
    rms = math.sqrt(statistics.fmean(e * e for e, _ in every))
    rest = math.sqrt(statistics.fmean(r for _, r in every))
    print(f"  RMS log(published / predicted), amp <-> amp: {rms:.3f} over {len(every)} rows; "
          f"the other pieces of the same intervals (fit, micro-batch, carried defaults) "
          f"{rest:.3f}; net, the transfer's own piece: {net(every):.3f}; shipped "
          f"{SIGMA_OTHER_GPU_SAME_PRECISION}")
    quiet = [(e, r) for e, r in every if r < 0.15 ** 2]  # the carried defaults swamp the rest
    print(f"  the {len(quiet)} rows whose other pieces are under 0.15: RMS "
          f"{math.sqrt(statistics.fmean(e * e for e, _ in quiet)):.3f}, net {net(quiet):.3f}")
    print_lomo_piece(logs, net, "net piece")


def print_lomo_piece(logs: dict[str, list[tuple[float, float]]], derive, name: str) -> None:
    """For each model, the piece ``derive`` gives from the other models' (log error, other
    variance) pairs, and how many of the held-out model's rows fall inside ±1.645 of it with
    their own other pieces; then the coverage over all."""
    from mlflow_gpuopt.perfmodel.uncertainty import Z90

    covered = 0
    for held in sorted(logs):
        piece = derive([x for m, v in logs.items() if m != held for x in v])
        inside = sum(abs(e) <= Z90 * math.sqrt(piece * piece + r) for e, r in logs[held])
        covered += inside
        print(f"  without {held:28s} {name} {piece:.3f}, covers {inside}/{len(logs[held])}")
    print(f"  leave-one-model-out coverage "
          f"{100 * covered / sum(len(v) for v in logs.values()):.1f}%")


def derive_precision_width(rows, wl, hw) -> None:
    """``uncertainty.SIGMA_OTHER_PRECISION`` derived from the pairs no task scores: each
    1-GPU row predicted from the same model's row at the other precision family on the same
    GPU (fp32 or TF32 <-> AMP). Printed: the RMS of log(published / predicted) and the net
    piece (the mean of the other pieces' variances taken out of the mean squared error) over
    the rows whose other pieces are under 0.15 (the carried FLOPs-only defaults swamp the
    rest); the maximum-likelihood piece over every row, each with its own other pieces; and
    that piece picked leave-one-model-out with how many held-out rows fall inside ±1.645 of
    it."""
    from mlflow_gpuopt.perfmodel.uncertainty import SIGMA_OTHER_PRECISION, TERM_OTHER_PRECISION

    def same_gpu_other_family(src: Row, t: Row) -> bool:
        path = wl[src.model][0]  # ResNet-50's AMP rows ran channels-last: another layout too
        return (t.gpu == src.gpu and FAMILY[t.precision] != FAMILY[src.precision]
                and memory_format(path, src.precision) == memory_format(path, t.precision))

    logs = pair_logs(rows, wl, same_gpu_other_family, TERM_OTHER_PRECISION)
    every = [x for v in logs.values() for x in v]
    quiet = [(e, r) for e, r in every if r < 0.15 ** 2]
    rms = math.sqrt(statistics.fmean(e * e for e, _ in quiet))
    net = math.sqrt(max(0.0, statistics.fmean(e * e - r for e, r in quiet)))
    grid = [i / 1000 for i in range(501)]

    def likeliest(pairs) -> float:
        return min(grid, key=lambda s: sum(math.log(r + s * s) + e * e / (r + s * s)
                                           for e, r in pairs))

    print(f"  {len(every)} same-GPU other-precision rows of {len(logs)} models; the "
          f"{len(quiet)} with other pieces under 0.15: RMS log(published / predicted) "
          f"{rms:.3f}, net of those pieces {net:.3f}; maximum likelihood over all "
          f"{likeliest(every):.3f}; shipped {SIGMA_OTHER_PRECISION}")
    print_lomo_piece(logs, likeliest, "piece")


def main() -> int:
    rows, wl, hw = load_rows(), workloads("--profile-figures" in sys.argv[1:]), hardware()
    summaries = {
        "1a scaling, given 1 GPU -> 4/8/16": report(
            "Task 1a: scaling within a GPU type, given 1 GPU, predict 4/8/16",
            task_scaling(rows, wl, hw, (1,), (4, 8, 16), False), "linear scaling"),
        "1b scaling, given 1+2 GPUs -> 4/8/16": report(
            "Task 1b: scaling within a GPU type, given 1 and 2 GPUs, predict 4/8/16",
            task_scaling(rows, wl, hw, (1, 2), (4, 8, 16), False), "linear scaling"),
        "1d BERT DDP on 8 GPUs (scaling)": report(
            "Task 1d: BERT-class DDP scaling on one 8-GPU node, given 1 GPU (the error of "
            "the throughput is the error of the scaling efficiency)",
            task_scaling([r for r in rows if r.model.startswith("bert")], wl, hw, (1,), (8,),
                         False), "linear scaling"),
        "1c multi-node, given 8 -> 16..256": report(
            "Task 1c: multi-node, given one 8-GPU node, predict 16-256 GPUs",
            task_scaling(rows, wl, hw, (8,), (16, 32, 64, 128, 256), True), "linear scaling"),
        "2 across GPU types (1 GPU)": report(
            "Task 2: across GPU types (V100 <-> A100, fp32<->tf32, amp<->amp), 1 GPU",
            task_cross_gpu(rows, wl, hw), "peak-FLOPs ratio"),
        "3 prior only (no GPU run)": report(
            "Task 3: no GPU measurement (CPU-only case): 1-GPU rows from the profile alone",
            task_prior_only(rows, wl, hw), "none"),
        "3a prior only, described transformer": report(
            "Task 3a: no GPU measurement, transformers described by their architecture",
            task_prior_only(rows, wl, hw, True), "none"),
        "3b prior only, FLOPs and shape only": report(
            "Task 3b: no GPU measurement, workloads without a transformer architecture",
            task_prior_only(rows, wl, hw, False), "none"),
    }
    models = tracked_models(sys.argv[1:])
    if models:
        print(f"\n== Tracking {', '.join(models)} on the CPU (gpuopt.track(), a few steps each)")
        runs = tracked_runs(models)
        prior = [r for r in task_prior_only(rows, wl, hw) if r.model in models]
        cross = [r for r in task_cross_gpu(rows, wl, hw) if r.model in models]
        summaries["3 prior only, the tracked models' files"] = report(
            "Task 3 on the tracked models, workload files only", prior, "none")
        tracked_prior = task_tracked_prior(rows, wl, runs)
        summaries["3t no GPU run, tracked CPU profile"] = report(
            "Task 3t: no GPU measurement, predict --run-id of the CPU run", tracked_prior,
            "none")
        print("\n== Task 3t mean log(published / predicted) by precision")
        print_precision_gap(tracked_prior)
        print("\n== Task 3t interval width leave-one-model-out (not-described models)")
        lomo_tracked_prior_width(tracked_prior, wl)
        summaries["2 across GPU types, the tracked models' files"] = report(
            "Task 2 on the tracked models, workload files", cross, "peak-FLOPs ratio")
        tracked_cross = task_tracked_cross_gpu(rows, wl, runs)
        summaries["2t across GPU types, tracked profile"] = report(
            "Task 2t: across GPU types, the GPU row + the CPU run's profile.json",
            tracked_cross, "none")
        print("\n== Task 2t mean log(published / predicted) by precision")
        print_precision_gap(tracked_cross)
        if "--dump" in sys.argv[1:]:  # the tracked tasks' rows, to pool several stores
            Path(sys.argv[sys.argv.index("--dump") + 1]).write_text(json.dumps(
                {"3t": [asdict(r) for r in tracked_prior],
                 "2t": [asdict(r) for r in tracked_cross]}, default=str))
    if "--lomo" in sys.argv[1:]:
        print("\n== Task 2 leave-one-model-out: constants picked without the model scored")
        summaries["2 across GPU types, leave-one-model-out"] = report(
            "Task 2, leave-one-model-out constants", lomo_cross_gpu(rows, wl, hw),
            "peak-FLOPs ratio")
        print("\n== Task 2 same-precision cross-GPU width leave-one-model-out")
        lomo_other_gpu_width(rows, wl, hw)
        print("\n== Task 3 interval width leave-one-model-out")
        lomo_prior_width(rows, wl, hw)
    if "--derive-precision-width" in sys.argv[1:]:
        print("\n== Another precision's width from the same-GPU pairs no task scores")
        derive_precision_width(rows, wl, hw)
    print("\nSummary (goal: median <= 10%, p90 <= 25%, coverage >= 80%)")
    for name, s in summaries.items():
        print(f"  {name:38s} n={s['n']:3d} median {s['median_pct']:5.1f}%  "
              f"p90 {s['p90_pct']:5.1f}%  coverage {s['coverage_pct']:5.1f}%  "
              f"width {s['width']:5.2f}x")
    return 0


if __name__ == "__main__":
    import gemm_shape

    with gemm_shape.from_argv():  # --shape-gemm: the shape-dependent GEMM prior
        code = main()
    sys.exit(code)
