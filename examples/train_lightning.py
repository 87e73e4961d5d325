"""The small ResNet under PyTorch Lightning, with ``mlflow.autolog()`` and gpuopt tracking.

    python examples/train_lightning.py --steps 30

``mlflow.autolog()`` and ``gpuopt.track()`` share one run: tracking starts (or joins) the run
first, and Lightning's autologging logs into that active run. Logs into MLflow's current
tracking URI (``sqlite:///mlflow.db`` if none is set).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias

from _common import base_parser, setup_mlflow
from train_resnet import ResNetConfig, SmallResNet, synthetic_batch


def make_module(cfg: ResNetConfig):
    import lightning as L  # noqa: N812 - Lightning's documented alias

    class LitResNet(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = SmallResNet(cfg)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=cfg.lr, momentum=0.9)

    return LitResNet()


def make_loader(cfg: ResNetConfig, steps: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    xs, ys = zip(*(synthetic_batch(cfg, gen) for _ in range(steps)), strict=True)
    ds = torch.utils.data.TensorDataset(torch.cat(xs), torch.cat(ys))
    return torch.utils.data.DataLoader(ds, batch_size=cfg.batch_size, shuffle=False)


def main(argv: list[str] | None = None) -> str | None:
    """Train and track; returns the MLflow run id."""
    import lightning as L  # noqa: N812 - Lightning's documented alias
    import mlflow

    import mlflow_gpuopt as gpuopt

    args = base_parser("Small ResNet under Lightning + mlflow.autolog()", steps=30).parse_args(argv)
    torch.manual_seed(args.seed)
    setup_mlflow()
    mlflow.autolog(log_models=False, silent=True)
    cfg = ResNetConfig()
    module = make_module(cfg)
    trainer = L.Trainer(max_steps=args.steps, max_epochs=1, accelerator="auto", devices=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    with gpuopt.track(model=module, interval_s=args.interval, name="small-resnet-lightning") as t:
        trainer.fit(module, make_loader(cfg, args.steps, args.seed))
    return t.run_id


if __name__ == "__main__":
    main()
