"""Lightning: GpuOptCallback tracks into the run of the trainer's MLFlowLogger."""

from __future__ import annotations

import mlflow
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias

import lightning as L  # noqa: N812 - Lightning's conventional alias


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def test_callback_joins_the_mlflow_logger_run(tracking_uri):
    from lightning.pytorch.loggers import MLFlowLogger

    from mlflow_gpuopt.tracking.lightning import GpuOptCallback

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 16), torch.randint(0, 4, (48,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    mlf = MLFlowLogger(experiment_name="lit", tracking_uri=tracking_uri)
    cb = GpuOptCallback(interval_s=0.1, print_summary=False)
    trainer = L.Trainer(max_steps=6, logger=mlf, callbacks=[cb], accelerator="cpu",
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(Tiny(), loader)
    assert cb.tracker.run_id == mlf.run_id
    run = mlflow.get_run(mlf.run_id)
    assert run.data.params["gpuopt.micro_batch"] == "8"
    assert run.data.params["gpuopt.optimizer"] == "Adam"
    assert run.data.metrics["gpuopt/summary/steps"] == 6
    assert "loss" in run.data.metrics  # Lightning's own logging, same run
    assert len(mlflow.search_runs(experiment_names=["lit"])) == 1
