"""The integrations with the real libraries (models built from configs, no network):
accelerate's prepared objects under ``track()``, ``transformers.Trainer`` with
``report_to=["mlflow"]`` and gpuopt's callback, a LightningModule whose ``training_step``
bypasses its own ``forward``. Steps, samples, micro-batch, accumulation and FLOPs are
compared with counts the tests make themselves."""

from __future__ import annotations

import dataclasses
import logging

import mlflow
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from support.tracking import gpuopt_warnings, logged, samples_per_step

import mlflow_gpuopt as gpuopt

OPTS = {"interval_s": 0.1, "print_summary": False, "warmup_steps": 1}
LAYERS, WIDTH, HEADS, VOCAB, SEQ = 2, 64, 2, 128, 16


def gpt_flops_per_sample(layers: int, width: int, vocab: int, seq: int) -> float:
    """Forward + backward FLOPs of one sequence through a GPT-2: 6 per weight per token for
    the blocks' 12 d^2 weights and the (tied) LM head, plus attention's QK^T and AV (4 T d
    forward per token and layer, twice that backward). The profile counts these model FLOPs
    (SDPA's backward at 2 x its forward), so it matches to the param's 6 digits."""
    weights = layers * 12 * width * width + vocab * width
    return seq * (6 * weights + 12 * layers * seq * width)


def tiny_gpt():
    import transformers
    cfg = transformers.GPT2Config(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB,
                                  n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def test_accelerate_prepared_objects(tracking_uri):
    import accelerate
    acc = accelerate.Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=2)
    model = tiny_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    micro, batches = 4, 12
    ids = torch.randint(0, VOCAB, (micro * batches, SEQ))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=micro)
    model, opt, loader = acc.prepare(model, opt, loader)
    assert type(opt).__name__ == "AcceleratedOptimizer"
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for (x,) in loader:  # accelerate's documented accumulation loop
            with acc.accumulate(model):
                acc.backward(model(input_ids=x, labels=x).loss)
                opt.step()
                opt.zero_grad()
    params, metrics = logged(t.run_id)
    assert metrics["gpuopt/summary/steps"] == batches // 2
    assert params["gpuopt.micro_batch"] == str(micro)
    assert params["gpuopt.grad_accum"] == "2"
    assert params["gpuopt.optimizer"] == "AdamW"
    assert params["gpuopt.tokens_per_sample"] == str(SEQ)
    assert samples_per_step(metrics) == pytest.approx(2 * micro)
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        gpt_flops_per_sample(LAYERS, WIDTH, VOCAB, SEQ), rel=1e-5)


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_transformers_trainer_joins_the_mlflow_run(tracking_uri, tmp_path, monkeypatch, caplog):
    import transformers
    from mlflow_gpuopt.integrations.transformers import GpuOptCallback

    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf")
    micro, accum, steps = 4, 2, 6
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum, max_steps=steps, learning_rate=1e-3,
        report_to=["mlflow"], run_name="hf-tiny", use_cpu=True, save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, seed=0)
    cb = GpuOptCallback(**OPTS)
    trainer = transformers.Trainer(model=tiny_gpt(), args=args,
                                   train_dataset=TokenDataset(micro * accum * steps),
                                   callbacks=[cb])
    trainer.train()
    runs = mlflow.search_runs(experiment_names=["hf"])
    assert len(runs) == 1  # HF's run, not a second one
    run_id = runs.iloc[0]["run_id"]
    run = mlflow.get_run(run_id)
    assert run.info.run_name == "hf-tiny"
    assert run.data.tags["gpuopt.tracked"] == "true"
    assert "loss" in run.data.metrics  # transformers' own logging, same run
    params, metrics = logged(run_id)
    assert metrics["gpuopt/summary/steps"] == steps
    assert params["gpuopt.micro_batch"] == str(micro)
    assert params["gpuopt.grad_accum"] == str(accum)
    assert params["gpuopt.optimizer"] == "AdamW"
    assert samples_per_step(metrics) == pytest.approx(micro * accum)
    assert metrics["gpuopt/summary/throughput_tokens_per_s"] == pytest.approx(
        SEQ * metrics["gpuopt/summary/throughput_samples_per_s"], rel=1e-6)
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        gpt_flops_per_sample(LAYERS, WIDTH, VOCAB, SEQ), rel=1e-5)
    assert gpuopt_warnings(caplog) == []


@pytest.mark.parametrize("reentrant", [True, False])
def test_transformers_trainer_with_gradient_checkpointing(tracking_uri, tmp_path, monkeypatch,
                                                          caplog, reentrant):
    """``gradient_checkpointing=True`` (HF's reentrant default and the non-reentrant kind):
    the model FLOPs are the un-checkpointed model's, the replayed forward is counted apart,
    the mode reads ``full``, and the GPT-2 config's architecture is logged."""
    import transformers
    from mlflow_gpuopt.integrations.transformers import GpuOptCallback

    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf-ckpt")
    micro, steps = 4, 5
    # transformers 5 renamed gradient_checkpointing(_kwargs) to activation_checkpointing(_kwargs)
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    ckpt = ("activation_checkpointing" if "activation_checkpointing" in fields
            else "gradient_checkpointing")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=micro, max_steps=steps,
        learning_rate=1e-3, report_to=["mlflow"], use_cpu=True, save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, seed=0,
        **{ckpt: True, f"{ckpt}_kwargs": {"use_reentrant": reentrant}})
    trainer = transformers.Trainer(model=tiny_gpt(), args=args,
                                   train_dataset=TokenDataset(micro * steps),
                                   callbacks=[GpuOptCallback(**OPTS)])
    trainer.train()
    (run_id,) = mlflow.search_runs(experiment_names=["hf-ckpt"])["run_id"]
    params, metrics = logged(run_id)
    assert metrics["gpuopt/summary/steps"] == steps
    assert params["gpuopt.recompute"] == "full"
    model_flops = gpt_flops_per_sample(LAYERS, WIDTH, VOCAB, SEQ)
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(model_flops, rel=1e-5)
    # the blocks' forward replayed in the backward: at most the blocks' forward (a third of
    # their 6-per-weight work plus attention's forward), more than nothing
    blocks_forward = SEQ * (2 * LAYERS * 12 * WIDTH * WIDTH + 4 * LAYERS * SEQ * WIDTH)
    assert 0 < float(params["gpuopt.recompute_flops_per_sample"]) <= blocks_forward * 1.000001
    assert (params["gpuopt.num_layers"], params["gpuopt.hidden_size"],
            params["gpuopt.num_heads"], params["gpuopt.vocab_size"], params["gpuopt.mlp"],
            params["gpuopt.ffn_hidden_size"]) == (
        str(LAYERS), str(WIDTH), str(HEADS), str(VOCAB), "gelu", str(4 * WIDTH))
    assert gpuopt_warnings(caplog) == []


def test_config_from_training_arguments():
    import transformers
    from mlflow_gpuopt.integrations.transformers import config_from_args

    args = transformers.TrainingArguments(output_dir="unused", per_device_train_batch_size=16,
                                          gradient_accumulation_steps=4, bf16=True,
                                          use_cpu=True, run_name="r", report_to=[])
    cfg = config_from_args(args, gpuopt.TrackConfig(micro_batch=32))
    assert (cfg.micro_batch, cfg.grad_accum, cfg.precision, cfg.run_name) == (32, 4, "bf16", "r")


def fit_bypass(define_forward: bool):
    """A LightningModule whose training_step calls ``self.net(x)``, with or without a
    ``forward`` of its own; returns the callback after ``trainer.fit``."""
    import lightning as L  # noqa: N812 - Lightning's conventional alias
    from mlflow_gpuopt.integrations.lightning import GpuOptCallback

    class Bypass(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class BypassWithForward(Bypass):
        def forward(self, x):  # defined, but training_step never calls it
            return self.net(x)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    cb = GpuOptCallback(**OPTS)
    trainer = L.Trainer(max_steps=6, logger=False, callbacks=[cb], accelerator="cpu",
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    module = BypassWithForward() if define_forward else Bypass()
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    return cb


def test_lightning_module_without_forward_tracks_its_net(tracking_uri, caplog):
    caplog.set_level(logging.WARNING)
    cb = fit_bypass(define_forward=False)
    assert gpuopt_warnings(caplog) == []
    params, metrics = logged(cb.tracker.run_id)
    assert metrics["gpuopt/summary/steps"] == 6
    assert samples_per_step(metrics) == pytest.approx(8)
    assert params["gpuopt.micro_batch"] == "8"
    assert params["gpuopt.grad_accum"] == "1"
    # Linear(16, 32) (no input gradient) + Linear(32, 4): forward 2 x, backward 1 x and 2 x
    expected = 2 * 16 * 32 * 2 + 2 * 32 * 4 * 3
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(expected, rel=0.01)


def test_lightning_forward_bypassed_warns_once(tracking_uri, caplog):
    caplog.set_level(logging.WARNING)
    cb = fit_bypass(define_forward=True)
    warnings = gpuopt_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "never ran" in warnings[0] and "track(model=" in warnings[0]
    params, metrics = logged(cb.tracker.run_id)
    assert metrics["gpuopt/summary/steps"] == 6
    assert samples_per_step(metrics) == pytest.approx(8)  # from the DataLoader's batches
