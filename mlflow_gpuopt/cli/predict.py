"""``mlflow gpuopt predict``: throughput, interval, step time and memory for one configuration.

    mlflow gpuopt predict --run-id ID --gpu A100-80GB-SXM4 --gpus 8
    mlflow gpuopt predict --workload w.json --observations o.csv --gpu "NVIDIA H100 80GB HBM3" \
        --gpus 16 --nodes 2 --strategy zero2 --micro-batch 8 --json
    mlflow gpuopt predict --run-id ID --gpu H100 --gpus 8 --tokens 2B     # + time to train
"""

from __future__ import annotations


import click

from mlflow_gpuopt.cli import _json
from mlflow_gpuopt.cli._errors import UsageError
from mlflow_gpuopt.cli.options import (
    check_file_inputs,
    load_catalog_or_fail,
    parse_target,
    reject_empty_values,
    run_options,
    target_options,
    workload_file_options,
)
from mlflow_gpuopt.perfmodel.activations import RECOMPUTE_MODES
from mlflow_gpuopt.validation import BOUNDS


@click.command("predict")
@click.option("--run-id", "run_ids", multiple=True,
              help="Run tracked with gpuopt.track() (repeatable).")
@workload_file_options
@click.option("--gpu", required=True, help="GPU to predict on (NVML or catalog name).")
@click.option("--gpus", type=click.IntRange(min=1, max=int(BOUNDS["gpu_count"].high)),
              required=True, help="Total GPUs.")
@click.option("--nodes", type=click.IntRange(min=1, max=int(BOUNDS["nodes"].high)),
              default=None, help="Nodes (default: as few as the catalog's largest machine "
                                 "allows).")
@click.option("--strategy", default=None,
              help="single, ddp, zero1, zero2, zero3, fsdp, tp[N], pp[N] or e.g. tp2xpp2xddp.")
@click.option("--micro-batch", type=click.IntRange(min=1, max=int(BOUNDS["micro_batch"].high)),
              default=None, help="Per-GPU micro-batch (default: the measured one).")
@click.option("--grad-accum", type=click.IntRange(min=1, max=int(BOUNDS["grad_accum"].high)),
              default=None, help="Gradient-accumulation steps (default: the measured one).")
@click.option("--precision", default=None,
              help="fp32, tf32, fp16, bf16 or fp8 (default: measured).")
@click.option("--recompute", type=click.Choice(list(RECOMPUTE_MODES)), default=None,
              help="Activation recomputation (default: the workload's own, else none).")
@click.option("--activation-checkpointing", is_flag=True,
              help="Full activation recomputation (same as --recompute full).")
@click.option("--virtual-stages", type=click.IntRange(min=1, max=int(BOUNDS["num_layers"].high)),
              default=None,
              help="Interleaved pipeline schedule: model chunks per pipeline stage.")
@run_options
@click.option("--instance-type", default=None,
              help="A catalog offer (e.g. p5.48xlarge): its GPUs per node, NVLink and network.")
@click.option("--inter-node-gbps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Node network, Gbit/s per node (default: the catalog's multi-node offers).")
@click.option("--power-limit-w", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The GPUs' power limit (nvidia-smi -pl), W, for the target and the runs "
                   "on the same GPU type (default: the board's TDP).")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def predict(run_ids, workload_path, observations_path, proxy_path, gpu, gpus, nodes, strategy,
            micro_batch, grad_accum, precision, recompute, activation_checkpointing, virtual_stages,
            run_flags, instance_type, inter_node_gbps, power_limit_w, samples, epochs,
            dataset_size, tokens, steps, as_json, seq_len) -> None:
    """Predict throughput, memory and step time for one configuration, and with a target
    (--samples, --epochs/--dataset-size, --tokens or --steps) the time to train."""
    from mlflow_gpuopt.planning.predicting import PredictRequest
    from mlflow_gpuopt.planning.predicting import predict as run_predict

    reject_empty_values(click.get_current_context())
    training_target = parse_target(samples=samples, epochs=epochs, dataset_size=dataset_size,
                                   tokens=tokens, steps=steps, required=False)
    check_file_inputs(bool(run_ids), workload_path, observations_path, proxy_path, seq_len)
    if activation_checkpointing and recompute not in (None, "full"):
        raise UsageError("--activation-checkpointing means --recompute full; give one of them")
    result = run_predict(PredictRequest(
        gpu=gpu, gpus=gpus, run_ids=tuple(run_ids), workload_path=workload_path,
        observations_path=observations_path, proxy_path=proxy_path, seq_len=seq_len,
        nodes=nodes, strategy=strategy, micro_batch=micro_batch, grad_accum=grad_accum,
        precision=precision, recompute=recompute,
        activation_checkpointing=activation_checkpointing, virtual_stages=virtual_stages,
        run=run_flags, instance_type=instance_type,
        inter_node_gbps=inter_node_gbps, power_limit_w=power_limit_w, target=training_target),
        load_catalog_or_fail())
    if as_json:
        click.echo(_json.dumps(result))
    else:
        from mlflow_gpuopt.report.text import prediction_text

        click.echo(prediction_text(result))
