"""Bad input, through the real CLI against a real sqlite MLflow store: one line, exit code 2.

Every invocation below is something a user (or a damaged run) can hand ``predict``,
``recommend`` or ``compare``: a corrupt ``profile.json`` (binary, a JSON list, 100k-deep
nesting, 400-digit integers), absurd values (1e300 FLOPs per sample, a micro-batch of 1e12,
a negative world size, throughput 1e300 or 1e-300), flags that are empty or not numbers
(``--confidence nan``, ``--deadline ""``) and layouts that contradict themselves. Each must
end with exactly one line starting with ``Error:``, exit code 2, no traceback, and no new
run in the store. The ranges that decide "absurd" live in :mod:`mlflow_gpuopt.validation`.

Also here: a recommendation that cannot be logged (read-only artifact root, full disk) is
still printed, with one line saying logging failed, exit code 1; a run whose trainer was
killed before its summary is usable from its per-interval throughput series.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.sqlite_store import sqlite_uri
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt

pytestmark = pytest.mark.faults

BIN = Path(sys.executable).parent
WORKLOAD = {"schema": "gpuopt.workload/1", "name": "resnet50", "params": 25557032,
            "flops_per_sample": 2.46e10, "precision": "fp16", "micro_batch": 256,
            "optimizer": "SGD", "optimizer_state_bytes_per_param": 4,
            "activation_bytes_per_sample": 1.1e8, "tokens_per_sample": None}
PARAMS = {"gpuopt.device": "NVIDIA A100-SXM4-80GB", "gpuopt.device_count": "1",
          "gpuopt.world_size": "1", "gpuopt.nodes": "1", "gpuopt.precision": "fp16",
          "gpuopt.micro_batch": "256", "gpuopt.grad_accum": "1", "gpuopt.strategy": "single",
          "gpuopt.params": "25557032", "gpuopt.flops_per_sample": "2.46e+10"}
OBS_HEADER = "gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,precision\n"
OBS_GOOD = OBS_HEADER + "NVIDIA A100-SXM4-80GB,1,1,256,2470,single,fp16\n"
#: A Mixtral-8x7B-shaped workload: 32 MoE layers of 8 experts (4.5e10 routed weights).
MOE_WORKLOAD = {"schema": "gpuopt.workload/1", "name": "moe", "params": 46_700_000_000,
                "flops_per_sample": 6 * 12.9e9 * 4096, "precision": "bf16", "micro_batch": 1,
                "tokens_per_sample": 4096, "num_layers": 32, "hidden_size": 4096,
                "num_heads": 32, "num_kv_heads": 8, "vocab_size": 32000,
                "ffn_hidden_size": 28672, "mlp": "swiglu", "num_experts": 8,
                "experts_per_token": 2, "expert_ffn_hidden_size": 14336}
MOE_OBS_HEADER = OBS_HEADER.strip() + ",expert_tensor_parallel\n"


def _deep(depth: int = 100_000) -> bytes:
    return ("[" * depth + "]" * depth).encode()


def _profile(**changes) -> bytes:
    return json.dumps({**WORKLOAD, **changes}).encode()


def _moe(**changes) -> bytes:
    return json.dumps({**MOE_WORKLOAD, **changes}).encode()


#: Run name -> (profile.json bytes or None for "no profile", param overrides).
RUNS = {
    "good": (_profile(), {}),
    "binary": (bytes(range(256)) * 4, {}),
    "json_list": (b"[1, 2, 3]", {}),
    "digits400": (json.dumps({**WORKLOAD, "params": 0}).replace(
        '"params": 0', '"params": ' + "9" * 400).encode(), {}),
    "digits5000": (json.dumps({**WORKLOAD, "params": 0}).replace(
        '"params": 0', '"params": ' + "9" * 5000).encode(), {}),
    "deep": (_deep(), {}),
    "deep_value": (json.dumps({**WORKLOAD, "name": 0}).replace(
        '"name": 0', '"name": ' + _deep().decode()).encode(), {}),
    "flops_1e300": (_profile(flops_per_sample=1e300), {}),
    "micro_batch_1e12": (_profile(micro_batch=10**12), {}),
    "params_1e15": (_profile(params=10**15), {}),
    "world_size_negative": (_profile(), {"gpuopt.world_size": "-4"}),
    "nodes_huge": (_profile(), {"gpuopt.nodes": "1e9", "gpuopt.world_size": ""}),
    "huge_model": (_profile(params=10**13, flops_per_sample=6e13 * 2048), {
        "gpuopt.params": str(10**13)}),
}

#: File name -> contents, for ``predict --workload/--observations``.
FILES = {
    "workload.json": _profile(),
    "obs.csv": OBS_GOOD.encode(),
    "w_binary.json": bytes(range(256)) * 4,
    "w_list.json": b"[]",
    "w_deep.json": _deep(),
    "w_digits400.json": RUNS["digits400"][0],
    "w_digits5000.json": RUNS["digits5000"][0],
    "w_flops_1e300.json": _profile(flops_per_sample=1e300),
    "w_micro_batch_1e12.json": _profile(micro_batch=10**12),
    "w_tokens_1e300.json": _profile(tokens_per_sample=1e300),
    # Hugging Face config.json's name: 64 query heads cannot be grouped by 7 key/value heads
    "w_kv_heads_7.json": _profile(num_attention_heads=64, num_key_value_heads=7),
    "w_kv_heads_0.json": _profile(num_heads=64, num_kv_heads=0),
    "o_thr_1e300.csv": (OBS_HEADER + "NVIDIA A100-SXM4-80GB,1,1,256,1e300,single,fp16\n").encode(),
    "o_thr_1e-300.csv": (OBS_HEADER
                         + "NVIDIA A100-SXM4-80GB,1,1,256,1e-300,single,fp16\n").encode(),
    "o_count_digits400.csv": (OBS_HEADER + "NVIDIA A100-SXM4-80GB," + "9" * 400
                              + ",1,256,2470,ddp,fp16\n").encode(),
    "o_count_1e9.csv": (OBS_HEADER + "NVIDIA A100-SXM4-80GB,1000000000,1,256,2470,ddp,fp16\n"
                        ).encode(),
    "o_micro_batch_1e12.csv": (OBS_HEADER
                               + "NVIDIA A100-SXM4-80GB,1,1,1e12,2470,single,fp16\n").encode(),
    # a cell over the csv module's 128 KiB field limit (the csv module raises), one over ours
    "o_field_200k.csv": (OBS_HEADER + '"' + "x" * 200_000 + '",1,1,256,2470,single,fp16\n'
                         ).encode(),
    "o_cell_5000.csv": (OBS_HEADER + "NVIDIA A100-SXM4-80GB,1,1,256,2470,single," + "f" * 5000
                        + "\n").encode(),
    # counts beyond anything trained: a float of the int overflowed, or the arithmetic
    # raised (math domain error), a traceback; a 1e308 group count echoed 309 digits
    "w_moe_experts_1e12.json": _moe(num_experts=10**12, experts_per_token=2),
    "w_moe_groups_1e308.json": _moe(num_expert_groups=1e308, expert_groups_per_token=1),
    "w_moe_group_topk_1e308.json": _moe(num_expert_groups=4, expert_groups_per_token=1e308),
    "w_moe_etp_1e308.json": _moe(expert_tensor_parallel=1e308),  # was read, silently
    "w_moe_heads_1e308.json": _moe(num_heads=1e308),
    # expert weights the architecture gives beyond 'params': a negative dense part
    "w_moe_experts_exceed_params.json": _moe(expert_ffn_hidden_size=10**7),
    "w_moe_layer_freq_above_layers.json": _moe(moe_layer_freq=64),
    # sample counts whose sum overflows: every share became 0 (ZeroDivisionError)
    "w_bins_overflow.json": _moe(sequence_bins=[[128, 1e308], [4096, 1e308]]),
    # str() of a list was read as the optimizer's name
    "w_optimizer_list.json": _profile(optimizer=["AdamW"]),
    "w_mixed_precision_list.json": _profile(mixed_precision=["autocast"]),
    "w_grad_clip_text.json": _profile(grad_clip="true"),
    "w_mixed_precision_o3.json": _profile(mixed_precision="o3"),
    "w_moe_group_topk_above_groups.json": _moe(num_expert_groups=4,
                                               expert_groups_per_token=5),
    "w_moe_groups_not_dividing.json": _moe(num_expert_groups=3, expert_groups_per_token=1),
    "w_bins_longer.json": _moe(sequence_bins={"128": 0.5, "8192": 0.5}),
    "w_gemm_reduction_nan.json": _profile().replace(b'"tokens_per_sample": null',
                                                    b'"gemm_reduction_per_micro_step": NaN'),
    "w_amp_matmul_infinity.json": _profile().replace(
        b'"tokens_per_sample": null', b'"amp_matmul_traffic_bytes_per_sample": -Infinity'),
    "moe.json": _moe(),
    # DeepSeek-V3's config.json with its routing groups gone: "topk_group must be 1 to 1"
    "v3_no_n_group.json": json.dumps({
        **json.loads((Path(__file__).parents[1] / "fixtures" / "hf_configs"
                      / "deepseek_v3.json").read_text()), "n_group": None}).encode(),
    # a run's experts' tensor parallel that its own tp (1 for ep8xfsdp) cannot hold
    "o_moe_etp_2_tp1.csv": (MOE_OBS_HEADER + "H100,8,1,1,5.0,ep8xfsdp,bf16,2\n").encode(),
    "o_moe_etp_1e308.csv": (MOE_OBS_HEADER + "H100,8,1,1,5.0,ep8xfsdp,bf16,1e308\n").encode(),
    # a misspelt column was read as absent: the workload's default, silently
    "o_typo_column.csv": (OBS_HEADER.strip() + ",moe_dispacher\n"
                          "NVIDIA A100-SXM4-80GB,1,1,256,2470,single,fp16,flex\n").encode(),
    "o_moe_dispatcher_unknown.csv": (OBS_HEADER.strip() + ",moe_dispatcher\n"
                                     "H100,8,1,1,5.0,ep8xfsdp,bf16,pigeon\n").encode(),
    "o_moe_routing_unknown.csv": (OBS_HEADER.strip() + ",moe_routing\n"
                                  "H100,8,1,1,5.0,ep8xfsdp,bf16,sticky\n").encode(),
    "o_header_only.csv": OBS_HEADER.encode(),
    # DictReader keeps the last of two same-named columns, silently
    "o_dup_columns.csv": b"gpu,gpu_count,throughput_samples_per_s,gpu_count\n"
                         b"NVIDIA A100-SXM4-80GB,1,2470,8\n",
}


@dataclass(frozen=True)
class Store:
    uri: str
    runs: dict[str, str]  # name -> run id
    files: Path

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.uri)

    def run_count(self) -> int:
        c = self.client()
        return sum(len(c.search_runs([e.experiment_id]))
                   for e in c.search_experiments())


def _log_run(client, exp_id: str, name: str, profile: bytes | None, params: dict,
             tmp: Path, metrics: dict | None = None) -> str:
    rid = client.create_run(exp_id, run_name=name).info.run_id
    for k, v in {**PARAMS, **params}.items():
        client.log_param(rid, k, v)
    for k, v in (metrics or {"gpuopt/summary/throughput_samples_per_s": 2470.0}).items():
        for step, value in enumerate(v if isinstance(v, list) else [v]):
            client.log_metric(rid, k, value, step=step)
    if profile is not None:
        d = tmp / "artifacts" / name
        d.mkdir(parents=True)
        (d / "profile.json").write_bytes(profile)
        client.log_artifact(rid, str(d / "profile.json"), "gpuopt")
    client.set_terminated(rid)
    return rid


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    from mlflow import MlflowClient

    tmp = tmp_path_factory.mktemp("bad-input")
    uri = sqlite_uri(tmp / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("bad-input", artifact_location=str(tmp / "mlruns"))
    runs = {name: _log_run(client, exp, name, profile, params, tmp)
            for name, (profile, params) in RUNS.items()}
    files = tmp / "files"
    files.mkdir()
    for name, data in FILES.items():
        (files / name).write_bytes(data)
    return Store(uri=uri, runs=runs, files=files)


def _env(store: Store) -> dict[str, str]:
    return {"MLFLOW_TRACKING_URI": store.uri, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}


def _argv(store: Store, args: list[str]) -> list[str]:
    return [a.format(f=str(store.files) + "/", **store.runs) for a in args]


PREDICT = ["predict", "--gpu", "A100-80GB-SXM4", "--gpus", "1"]
PREDICT_FILES = [*PREDICT, "--workload", "{f}workload.json", "--observations", "{f}obs.csv"]
RECOMMEND = ["recommend", "--samples", "1M", "--no-log"]

#: (id, argv, what the one line must say). ``{f}`` is the files folder, ``{name}`` a run id.
CASES = [
    # a corrupt profile.json, read by recommend and predict
    ("recommend-profile-binary", [*RECOMMEND, "--run-id", "{binary}"], "profile.json"),
    ("predict-profile-binary", [*PREDICT, "--run-id", "{binary}"], "profile.json"),
    ("recommend-profile-list", [*RECOMMEND, "--run-id", "{json_list}"], "JSON object"),
    ("predict-profile-list", [*PREDICT, "--run-id", "{json_list}"], "JSON object"),
    ("recommend-profile-400-digits", [*RECOMMEND, "--run-id", "{digits400}"], "'params'"),
    ("recommend-profile-5000-digits", [*RECOMMEND, "--run-id", "{digits5000}"],
     "profile.json"),
    ("recommend-profile-100k-deep", [*RECOMMEND, "--run-id", "{deep}"], "nested"),
    ("predict-profile-100k-deep", [*PREDICT, "--run-id", "{deep}"], "nested"),
    ("recommend-profile-100k-deep-value", [*RECOMMEND, "--run-id", "{deep_value}"], "nested"),
    # absurd values in a run
    ("recommend-flops-1e300", [*RECOMMEND, "--run-id", "{flops_1e300}"], "flops_per_sample"),
    ("predict-flops-1e300", [*PREDICT, "--run-id", "{flops_1e300}"], "flops_per_sample"),
    ("recommend-micro-batch-1e12", [*RECOMMEND, "--run-id", "{micro_batch_1e12}"],
     "micro_batch"),
    ("recommend-params-1e15", [*RECOMMEND, "--run-id", "{params_1e15}"], "params"),
    ("recommend-world-size-negative", [*RECOMMEND, "--run-id", "{world_size_negative}"],
     "world_size"),
    ("predict-world-size-negative", [*PREDICT, "--run-id", "{world_size_negative}"],
     "world_size"),
    ("recommend-nodes-1e9", [*RECOMMEND, "--run-id", "{nodes_huge}"], "nodes"),
    # corrupt or absurd workload.json / observations CSV
    ("predict-workload-100k-deep", [*PREDICT, "--workload", "{f}w_deep.json"], "nested"),
    ("predict-workload-400-digits", [*PREDICT, "--workload", "{f}w_digits400.json"],
     "'params'"),
    ("predict-workload-5000-digits", [*PREDICT, "--workload", "{f}w_digits5000.json"],
     "w_digits5000.json"),
    ("predict-workload-flops-1e300", [*PREDICT, "--workload", "{f}w_flops_1e300.json"],
     "flops_per_sample"),
    ("predict-workload-micro-batch-1e12", [*PREDICT, "--workload",
                                           "{f}w_micro_batch_1e12.json"], "micro_batch"),
    ("predict-workload-tokens-1e300", [*PREDICT, "--workload", "{f}w_tokens_1e300.json"],
     "tokens_per_sample"),
    ("predict-workload-kv-heads-7", [*PREDICT, "--workload", "{f}w_kv_heads_7.json"],
     "'num_kv_heads' must divide 'num_heads' (64)"),
    ("predict-workload-kv-heads-0", [*PREDICT, "--workload", "{f}w_kv_heads_0.json"],
     "'num_kv_heads' must be >= 1"),
    ("predict-observations-throughput-1e300",
     [*PREDICT, "--workload", "{f}workload.json", "--observations", "{f}o_thr_1e300.csv"],
     "throughput_samples_per_s"),
    ("predict-observations-throughput-1e-300",
     [*PREDICT, "--workload", "{f}workload.json", "--observations", "{f}o_thr_1e-300.csv"],
     "throughput_samples_per_s"),
    ("predict-observations-count-400-digits",
     [*PREDICT, "--workload", "{f}workload.json", "--observations",
      "{f}o_count_digits400.csv"], "gpu_count"),
    ("predict-observations-count-1e9",
     [*PREDICT, "--workload", "{f}workload.json", "--observations", "{f}o_count_1e9.csv"],
     "gpu_count"),
    ("predict-observations-micro-batch-1e12",
     [*PREDICT, "--workload", "{f}workload.json", "--observations",
      "{f}o_micro_batch_1e12.csv"], "micro_batch"),
    ("predict-observations-field-200k",
     [*PREDICT, "--workload", "{f}workload.json", "--observations", "{f}o_field_200k.csv"],
     "not a readable CSV"),
    ("predict-observations-cell-5000",
     [*PREDICT, "--workload", "{f}workload.json", "--observations", "{f}o_cell_5000.csv"],
     "longer than 4096"),
    ("predict-observations-duplicate-column",
     [*PREDICT, "--workload", "{f}workload.json", "--observations", "{f}o_dup_columns.csv"],
     "gpu_count given twice"),
    # endless or huge files: refused after reading the cap, not read until memory runs out
    ("predict-workload-dev-zero", [*PREDICT, "--workload", "/dev/zero"],
     "MiB limit for workload files"),
    ("predict-observations-dev-zero",
     [*PREDICT, "--workload", "{f}workload.json", "--observations", "/dev/zero"],
     "MiB limit for observations files"),
    # flags: not a number, absurd, empty
    ("recommend-confidence-nan", [*RECOMMEND, "--run-id", "{good}", "--confidence", "nan"],
     "--confidence"),
    ("recommend-confidence-minus-nan",
     [*RECOMMEND, "--run-id", "{good}", "--confidence", "-nan"], "--confidence"),
    ("recommend-epochs-1e200", ["recommend", "--run-id", "{good}", "--epochs", "1e200",
                                "--dataset-size", "1e200", "--json", "--no-log"],
     "samples"),
    ("recommend-samples-1e30", ["recommend", "--run-id", "{good}", "--samples", "1e30",
                                "--no-log"], "--samples"),
    ("predict-samples-1e30", [*PREDICT_FILES, "--samples", "1e30"], "--samples"),
    ("recommend-steps-1e300", ["recommend", "--run-id", "{good}", "--steps", "1e300",
                                "--no-log"], "--steps"),
    ("predict-micro-batch-1e12", [*PREDICT_FILES, "--micro-batch", "1000000000000"],
     "--micro-batch"),
    ("predict-gpus-1e7", ["predict", "--gpu", "A100-80GB-SXM4", "--gpus", "10000000",
                          "--workload", "{f}workload.json"], "--gpus"),
    ("predict-grad-accum-1e12", [*PREDICT_FILES, "--grad-accum", "1000000000000"],
     "--grad-accum"),
    ("recommend-deadline-empty", [*RECOMMEND, "--run-id", "{good}", "--deadline", ""],
     "--deadline"),
    ("recommend-region-empty", [*RECOMMEND, "--run-id", "{good}", "--region", ""],
     "--region"),
    ("recommend-run-id-empty", [*RECOMMEND, "--run-id", ""], "--run-id"),
    ("predict-strategy-empty", [*PREDICT_FILES, "--strategy", ""], "--strategy"),
    ("compare-dataset-size-empty", ["compare", "--run-id", "{good}", "--dataset-size", ""],
     "--dataset-size"),
    # layouts that contradict themselves
    ("predict-strategy-pp-twice", ["predict", "--gpu", "A100-80GB-SXM4", "--gpus", "8",
                                   "--workload", "{f}workload.json", "--strategy",
                                   "tp2xpp2xpp4"], "pipeline"),
    ("predict-strategy-two-dp", ["predict", "--gpu", "A100-80GB-SXM4", "--gpus", "8",
                                 "--workload", "{f}workload.json", "--strategy", "ddpxzero3"],
     "data-parallel"),
    ("predict-fp8-on-v100", ["predict", "--gpu", "V100-SXM2-16GB", "--gpus", "1",
                             "--workload", "{f}workload.json", "--precision", "fp8"], "fp8"),
    # degrees no job has: a 5000-digit one was a ValueError traceback (Python's int limit)
    ("predict-strategy-5000-digit-tp", [*PREDICT_FILES, "--strategy", "tp" + "9" * 5000],
     "more than any job has"),
    ("predict-strategy-vp-1e11", [*PREDICT_FILES, "--strategy", "pp2xvp99999999999"],
     "more than any job has"),
    ("predict-virtual-stages-1e14", [*PREDICT_FILES, "--virtual-stages", "99999999999999"],
     "--virtual-stages"),
    ("predict-pp-microbatches-1e14", [*PREDICT_FILES, "--pp-microbatches", "99999999999999"],
     "--pp-microbatches"),
    # mixture-of-experts keys and flags
    ("predict-workload-experts-1e12", [*PREDICT, "--workload", "{f}w_moe_experts_1e12.json"],
     "'num_experts' = 1000000000000"),
    ("predict-workload-expert-groups-1e308",
     [*PREDICT, "--workload", "{f}w_moe_groups_1e308.json"], "'num_expert_groups' = 1e+308"),
    ("predict-workload-expert-groups-per-token-1e308",
     [*PREDICT, "--workload", "{f}w_moe_group_topk_1e308.json"],
     "'expert_groups_per_token' = 1e+308"),
    ("predict-workload-expert-tp-1e308", [*PREDICT, "--workload", "{f}w_moe_etp_1e308.json"],
     "'expert_tensor_parallel' = 1e+308"),
    ("predict-workload-heads-1e308", [*PREDICT, "--workload", "{f}w_moe_heads_1e308.json"],
     "'num_heads' = 1e+308"),
    ("predict-workload-experts-exceed-params",
     [*PREDICT, "--workload", "{f}w_moe_experts_exceed_params.json"], "exceed 'params'"),
    ("predict-workload-moe-layer-freq-above-layers",
     [*PREDICT, "--workload", "{f}w_moe_layer_freq_above_layers.json"], "'moe_layer_freq'"),
    ("predict-workload-sequence-bins-overflow",
     [*PREDICT, "--workload", "{f}w_bins_overflow.json"], "'sequence_bins'"),
    ("predict-workload-optimizer-list", [*PREDICT, "--workload", "{f}w_optimizer_list.json"],
     "'optimizer' must be text"),
    ("predict-workload-mixed-precision-list",
     [*PREDICT, "--workload", "{f}w_mixed_precision_list.json"],
     "'mixed_precision' must be text"),
    ("predict-expert-tp-not-dividing-tp",
     ["predict", "--gpu", "H100", "--gpus", "8", "--workload", "{f}moe.json",
      "--strategy", "tp2xep4xfsdp", "--expert-tensor-parallel", "4"],
     "--expert-tensor-parallel 4 must divide the tensor-parallel degree tp2"),
    ("predict-expert-tp-without-tp",
     ["predict", "--gpu", "H100", "--gpus", "8", "--workload", "{f}moe.json",
      "--strategy", "ep8xfsdp", "--expert-tensor-parallel", "2"],
     "--expert-tensor-parallel 2 must divide the tensor-parallel degree tp1"),
    ("predict-expert-tp-dense", [*PREDICT_FILES, "--expert-tensor-parallel", "2"],
     "--expert-tensor-parallel 2: the experts' tensor parallel needs a mixture-of-experts"),
    ("recommend-expert-tp-dense",
     [*RECOMMEND, "--run-id", "{good}", "--expert-tensor-parallel", "2"],
     "needs a mixture-of-experts workload"),
    ("recommend-expert-tp-divides-no-node",
     ["recommend", "--workload", "{f}moe.json", "--tokens", "1B", "--no-log",
      "--expert-tensor-parallel", "3"],
     "--expert-tensor-parallel 3 divides no offer's GPUs per node"),
    ("predict-observations-expert-tp-above-tp",
     ["predict", "--gpu", "H100", "--gpus", "8", "--workload", "{f}moe.json",
      "--observations", "{f}o_moe_etp_2_tp1.csv", "--strategy", "ep8xfsdp"],
     "expert_tensor_parallel 2 must divide the row's tensor-parallel degree tp1"),
    ("predict-observations-expert-tp-1e308",
     ["predict", "--gpu", "H100", "--gpus", "8", "--workload", "{f}moe.json",
      "--observations", "{f}o_moe_etp_1e308.csv", "--strategy", "ep8xfsdp"],
     "'expert_tensor_parallel' = '1e308'"),
    ("predict-config-topk-group-without-n-group",
     [*PREDICT, "--workload", "{f}v3_no_n_group.json", "--seq-len", "4096"],
     "'topk_group' 4 needs 'n_group' (the expert groups it picks from), got None"),
    ("predict-observations-misspelt-column",
     [*PREDICT, "--workload", "{f}workload.json", "--observations", "{f}o_typo_column.csv"],
     "unknown column 'moe_dispacher'; did you mean 'moe_dispatcher'?"),
]

#: Bad inputs that already ended in one line and exit 2 before the checks above; kept so the
#: suite counts every bad input it tries.
HELD = [
    ("predict-workload-binary", [*PREDICT, "--workload", "{f}w_binary.json"], "UTF-8"),
    ("predict-workload-list", [*PREDICT, "--workload", "{f}w_list.json"], "JSON object"),
    ("predict-epochs-1e200", [*PREDICT_FILES, "--epochs", "1e200", "--dataset-size", "1e200",
                              "--json"], "samples"),
    ("recommend-experiment-empty", [*RECOMMEND, "--experiment", ""], "--experiment"),
    ("predict-workload-empty", [*PREDICT, "--workload", ""], "--workload"),
    ("recommend-confidence-inf", [*RECOMMEND, "--run-id", "{good}", "--confidence", "inf"],
     "--confidence"),
    ("recommend-confidence-0", [*RECOMMEND, "--run-id", "{good}", "--confidence", "0"],
     "--confidence"),
    ("recommend-confidence-1", [*RECOMMEND, "--run-id", "{good}", "--confidence", "1"],
     "--confidence"),
    ("predict-workload-grad-clip-text", [*PREDICT, "--workload", "{f}w_grad_clip_text.json"],
     "'grad_clip' must be true or false"),
    ("predict-workload-mixed-precision-o3",
     [*PREDICT, "--workload", "{f}w_mixed_precision_o3.json"], "unknown mixed_precision 'o3'"),
    ("predict-workload-expert-groups-per-token-above-groups",
     [*PREDICT, "--workload", "{f}w_moe_group_topk_above_groups.json"],
     "'expert_groups_per_token' (5) must be 1 to 'num_expert_groups' (4)"),
    ("predict-workload-expert-groups-not-dividing",
     [*PREDICT, "--workload", "{f}w_moe_groups_not_dividing.json"],
     "'num_expert_groups' (3) must divide 'num_experts' (8)"),
    ("predict-workload-sequence-bins-longer",
     [*PREDICT, "--workload", "{f}w_bins_longer.json"], "at most 'tokens_per_sample' (4096)"),
    ("predict-workload-gemm-reduction-nan",
     [*PREDICT, "--workload", "{f}w_gemm_reduction_nan.json"],
     "'gemm_reduction_per_micro_step' must be a finite number"),
    ("predict-workload-amp-matmul-minus-infinity",
     [*PREDICT, "--workload", "{f}w_amp_matmul_infinity.json"],
     "'amp_matmul_traffic_bytes_per_sample' must be a finite number"),
    ("predict-expert-tp-0", [*PREDICT_FILES, "--expert-tensor-parallel", "0"],
     "--expert-tensor-parallel"),
    ("predict-attention-kernel-unknown", [*PREDICT_FILES, "--attention-kernel", "fa9"],
     "--attention-kernel: unknown attention_kernel 'fa9'"),
    ("recommend-attention-kernel-unknown",
     [*RECOMMEND, "--run-id", "{good}", "--attention-kernel", "fa9"], "--attention-kernel"),
    ("predict-observations-dispatcher-unknown",
     ["predict", "--gpu", "H100", "--gpus", "8", "--workload", "{f}moe.json",
      "--observations", "{f}o_moe_dispatcher_unknown.csv"], "unknown moe_dispatcher 'pigeon'"),
    ("predict-observations-routing-unknown",
     ["predict", "--gpu", "H100", "--gpus", "8", "--workload", "{f}moe.json",
      "--observations", "{f}o_moe_routing_unknown.csv"], "unknown moe_routing 'sticky'"),
    ("predict-observations-header-only",
     [*PREDICT, "--workload", "{f}workload.json", "--observations", "{f}o_header_only.csv"],
     "no observations"),
]


@pytest.mark.parametrize("args,message", [c[1:] for c in CASES + HELD],
                         ids=[c[0] for c in CASES + HELD])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(store, args, message):
    before = store.run_count()
    result = CliRunner().invoke(gpuopt, _argv(store, args), env=_env(store))
    everything = result.output + (repr(result.exc_info[1]) if result.exc_info else "")
    assert result.exit_code == 2, everything[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error:") and message in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert len(lines[0]) < 400  # one readable line, not a 5000-digit echo
    assert store.run_count() == before


def test_unreachable_server_is_one_line_in_seconds_not_minutes(monkeypatch):
    """MLflow's own retries (7, 120 s each) held a command ~2.5 min against a server that is
    not there; the commands set 1 retry and 10 s for themselves, and put the environment back."""
    import socket
    import time

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    t0 = time.monotonic()
    result = CliRunner().invoke(gpuopt, ["advise", "--run-id", "0" * 32],
                                env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"})
    took = time.monotonic() - t0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code in (1, 2) and len(lines) == 1, result.output[-2000:]
    assert lines[0].startswith("Error:") and "Traceback" not in result.output
    assert took < 60, took  # 1 retry: seconds; MLflow's defaults: minutes
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the command's, not ours


def test_observations_with_a_byte_order_mark_are_read(store):
    """Excel's "CSV UTF-8" starts with a byte-order mark: the first column is still ``gpu``."""
    plain = store.files / "obs.csv"
    bom = store.files / "obs_bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    args = [*PREDICT, "--workload", "{f}workload.json", "--json", "--observations"]
    runs = [CliRunner().invoke(gpuopt, _argv(store, [*args, str(p)]), env=_env(store))
            for p in (plain, bom)]
    assert [r.exit_code for r in runs] == [0, 0], runs[1].output
    assert json.loads(runs[1].stdout) == json.loads(runs[0].stdout)


def test_observations_with_crlf_blank_lines_and_a_notes_column_are_read(store):
    """Windows line ends, blank lines above the header and between rows, and a column of
    the user's own (not a misspelt one of ours) read as the plain file does."""
    plain = store.files / "obs.csv"
    header, row = OBS_GOOD.strip().split("\n")
    messy = store.files / "obs_messy.csv"
    messy.write_bytes(f"\ufeff\r\n\r\n{header},notes\r\n\r\n{row},first run\r\n\r\n"
                      .encode())
    args = [*PREDICT, "--workload", "{f}workload.json", "--json", "--observations"]
    runs = [CliRunner().invoke(gpuopt, _argv(store, [*args, str(p)]), env=_env(store))
            for p in (plain, messy)]
    assert [r.exit_code for r in runs] == [0, 0], runs[1].output
    assert json.loads(runs[1].stdout) == json.loads(runs[0].stdout)


def _run_record(store: Store, run_id: str) -> tuple:
    c = store.client()
    run = c.get_run(run_id)
    artifacts = sorted(a.path for a in c.list_artifacts(run_id, "gpuopt"))
    return (run.data.params, run.data.metrics, run.data.tags, artifacts)


@pytest.mark.parametrize("extra,message", [
    (["--expert-tensor-parallel", "2"], "mixture-of-experts"),
    (["--attention-kernel", "fa9"], "--attention-kernel"),
    (["--moe-dispatcher", "pigeon"], "--moe-dispatcher"),
], ids=["expert-tp-dense", "attention-kernel", "dispatcher"])
def test_a_failing_recommend_that_would_log_leaves_the_run_as_it_was(store, extra, message):
    """Without --no-log, a recommendation that fails on its input logs nothing: no nested
    run, no param, metric, tag or artifact added to the source run."""
    rid = store.runs["good"]
    before, count = _run_record(store, rid), store.run_count()
    result = CliRunner().invoke(gpuopt, ["recommend", "--samples", "1M", "--run-id", rid,
                                         *extra], env=_env(store))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert _run_record(store, rid) == before
    assert store.run_count() == count


@pytest.mark.parametrize("args", [
    ["compare", "--experiment", "any"], ["accuracy", "--experiment", "any"],
    [*RECOMMEND, "--run-id", "0123456789abcdef"], [*RECOMMEND, "--experiment", "any"]],
    ids=["compare", "accuracy", "recommend-run", "recommend-experiment"])
def test_a_store_that_cannot_be_read_is_one_line_without_its_credentials(args, monkeypatch):
    """MLflow's error text quotes the tracking URI, credentials and all; the one line the
    user sees has them masked (nothing listens on the port: the request fails at once)."""
    import socket

    with socket.socket() as s:  # a free port, closed again: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = "pl4nted-t0ken-7f3a"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    result = CliRunner().invoke(gpuopt, args, env={
        "MLFLOW_TRACKING_URI": f"http://alice:{secret}@127.0.0.1:{port}"})
    assert result.exit_code == 2, result.output[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    assert "127.0.0.1" in lines[0]  # it says which store
    assert secret not in result.output


@pytest.mark.slow
@pytest.mark.parametrize("case", ["recommend-profile-binary", "recommend-confidence-nan",
                                  "predict-workload-100k-deep"])
def test_real_process_stderr_is_one_line(store, case):
    """The same through a real process: nothing else (MLflow's logging) reaches stderr."""
    args = next(c[1] for c in CASES if c[0] == case)
    env = {**os.environ, **_env(store), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([str(BIN / "mlflow-gpuopt"), *_argv(store, args)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), out.stderr[-3000:]


def test_the_json_writer_never_writes_infinity_or_nan():
    """The backstop: a non-finite float (an unbounded interval end) is written as null."""
    from mlflow_gpuopt.cli._json import dumps

    text = dumps({"hours": [1.5, float("inf"), float("nan")], "x": (-float("inf"),)})
    assert json.loads(text) == {"hours": [1.5, None, None], "x": [None]}


def test_json_output_never_holds_infinity_or_nan(store):
    """``json.loads`` with a strict constant hook: Infinity/NaN would raise."""
    def strict(name):
        raise AssertionError(f"non-JSON constant {name} in the output")

    for args in ([*RECOMMEND, "--run-id", "{good}", "--json"],
                 [*PREDICT_FILES, "--samples", "1e18", "--json"]):
        result = CliRunner().invoke(gpuopt, _argv(store, args), env=_env(store))
        assert result.exit_code == 0, result.output[-3000:]
        json.loads(result.stdout, parse_constant=strict)


def test_no_plan_fits_is_said_once(store):
    """A 10-trillion-parameter model on at most one GPU: nothing fits, and the line says so
    once ("No plan fits: every offer was dropped ..."), exit 0."""
    result = CliRunner().invoke(gpuopt, _argv(store, [
        *RECOMMEND, "--run-id", "{huge_model}", "--max-gpus", "1"]), env=_env(store))
    assert result.exit_code == 0, result.output[-3000:]
    assert result.output.lower().count("no plan fits") == 1, result.output


# -- logging the recommendation fails: printed anyway, one line, exit 1 ----------------------

def _read_only_artifact_store(tmp_path) -> tuple[str, str]:
    """A sqlite store whose measured run is readable but where no new run can store
    artifacts: the experiment's artifact root is a path under a regular file, which even
    root cannot create (``NotADirectoryError``), like a refused or unmounted volume."""
    from mlflow import MlflowClient

    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("ro", artifact_location=str(tmp_path / "mlruns"))
    rid = _log_run(client, exp, "good", _profile(), {}, tmp_path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the artifact root should be")
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
                   (str(blocker / "mlruns"), exp))
    return uri, rid


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_recommendation_is_printed_when_logging_fails(tmp_path, as_json):
    uri, rid = _read_only_artifact_store(tmp_path)
    args = ["recommend", "--run-id", rid, "--samples", "1M", "--deadline", "48h"]
    result = CliRunner().invoke(gpuopt, args + (["--json"] if as_json else []),
                                env={"MLFLOW_TRACKING_URI": uri})
    assert result.exit_code == 1, result.output[-3000:]
    assert "Traceback" not in result.output
    err = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("Error:"), result.stderr
    assert "could not log the recommendation to MLflow" in err[0]
    if as_json:
        doc = json.loads(result.stdout)
        assert doc["candidates"] and "mlflow_run_id" not in doc
    else:
        assert "Target:" in result.stdout and "Logged to MLflow" not in result.stdout


def test_full_disk_while_logging_prints_the_result_and_redacts(tmp_path, monkeypatch, store):
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    password = "s3cr3t-pa55word"

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, f"No space left on device: http://u:{password}@host/x")

    monkeypatch.setattr(LocalArtifactRepository, "log_artifact", full)
    monkeypatch.setattr(LocalArtifactRepository, "log_artifacts", full)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment("full", artifact_location=str(tmp_path / "mlruns"))
    rid = _log_run(client, exp, "good", None, {}, tmp_path)
    result = CliRunner().invoke(gpuopt, ["recommend", "--run-id", rid, "--samples", "1M"],
                                env={"MLFLOW_TRACKING_URI": uri})
    assert result.exit_code == 1, result.output[-3000:]
    err = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "No space left on device" in err[0], result.stderr
    assert password not in result.output
    assert "Target:" in result.stdout


# -- a run whose trainer was killed before its summary ---------------------------------------

def test_killed_run_is_used_from_its_throughput_series(tmp_path):
    from mlflow import MlflowClient

    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("killed", artifact_location=str(tmp_path / "mlruns"))
    # warm-up, then steady at about 2470 samples/s; no gpuopt/summary/* (killed)
    series = [300.0, 1900.0, 2400.0, 2460.0, 2470.0, 2480.0, 2465.0, 2475.0]
    rid = _log_run(client, exp, "killed", _profile(), {}, tmp_path,
                   metrics={"gpuopt/throughput_samples_per_s": series})
    result = CliRunner().invoke(gpuopt, ["recommend", "--run-id", rid, "--samples", "1M",
                                         "--json", "--no-log"], env={"MLFLOW_TRACKING_URI": uri})
    assert result.exit_code == 0, result.output[-3000:]
    doc = json.loads(result.stdout)
    assert any("summary" in n and rid in n for n in doc["notes"]), doc["notes"]
    result = CliRunner().invoke(gpuopt, ["predict", "--run-id", rid, "--gpu", "A100-80GB-SXM4",
                                         "--gpus", "1", "--json"],
                                env={"MLFLOW_TRACKING_URI": uri})
    assert result.exit_code == 0, result.output[-3000:]
    # the steady part (median of the last half), not the warm-up-dragged mean
    assert json.loads(result.stdout)["throughput_samples_per_s"] == pytest.approx(2470, rel=0.02)
