"""Train a small ResNet on synthetic 32×32 images with SGD, tracked by gpuopt.

    python examples/train_resnet.py --steps 30

Images are generated: each class is a different oriented stripe pattern plus noise, so the
network has something real to learn. Logs into MLflow's current tracking URI
(``sqlite:///mlflow.db`` if none is set).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias

from _common import base_parser, setup_mlflow


@dataclass(frozen=True)
class ResNetConfig:
    num_classes: int = 10
    image_size: int = 32
    widths: tuple[int, ...] = (16, 32, 64)  # channels per stage; stages 2+ halve the resolution
    blocks_per_stage: int = 1
    batch_size: int = 32
    lr: float = 0.05


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """CIFAR-style ResNet: 3×3 stem, ``len(widths)`` stages of basic blocks, global pool, linear."""

    def __init__(self, cfg: ResNetConfig) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, cfg.widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cfg.widths[0]), nn.ReLU())
        layers, c_in = [], cfg.widths[0]
        for i, w in enumerate(cfg.widths):
            for j in range(cfg.blocks_per_stage):
                layers.append(BasicBlock(c_in, w, 2 if (i > 0 and j == 0) else 1))
                c_in = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def synthetic_batch(cfg: ResNetConfig, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose class sets the angle and colour of a stripe pattern, plus noise."""
    n, s = cfg.batch_size, cfg.image_size
    y = torch.randint(cfg.num_classes, (n,), generator=gen)
    angle = y.float() * (3.14159 / cfg.num_classes)
    coords = torch.arange(s).float()
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    phase = (xx[None] * torch.cos(angle)[:, None, None]
             + yy[None] * torch.sin(angle)[:, None, None])
    pattern = torch.sin(phase * 0.8)
    colour = torch.stack([(y % 3 == c).float() for c in range(3)], dim=1)[:, :, None, None]
    x = pattern[:, None] * (0.5 + colour) + 0.3 * torch.randn(n, 3, s, s, generator=gen)
    return x, y


def main(argv: list[str] | None = None) -> str | None:
    """Train and track; returns the MLflow run id."""
    import mlflow

    import mlflow_gpuopt as gpuopt

    parser = base_parser("Small ResNet on synthetic images, tracked by gpuopt", steps=30)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    setup_mlflow()
    cfg = ResNetConfig()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = SmallResNet(cfg).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(args.seed)
    with mlflow.start_run(run_name="small-resnet") as run:
        mlflow.log_params({"model": "SmallResNet", "batch_size": cfg.batch_size})
        with gpuopt.track(model=model, optimizer=opt, interval_s=args.interval,
                          name="small-resnet"):
            for step in range(args.steps):
                x, y = (z.to(device) for z in synthetic_batch(cfg, gen))
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if step % 10 == 0 or step == args.steps - 1:
                    mlflow.log_metric("loss", loss.item(), step=step)
                    print(f"step {step:4d}  loss {loss.item():.3f}")
        return run.info.run_id


if __name__ == "__main__":
    main()
