"""PyTorch Lightning: a callback that tracks ``trainer.fit`` into the run Lightning logs to.

    trainer = L.Trainer(logger=MLFlowLogger(...), callbacks=[GpuOptCallback()])

The run is, in order: an explicit ``run_id``; the run of the trainer's ``MLFlowLogger``; the
active run (e.g. ``mlflow.autolog()``'s); else a new one. A LightningModule that defines no
``forward`` cannot be called, so its ``training_step`` calls a submodule: when exactly one
child holds parameters (``self.net``), that child is the tracked model. (Wrapping ``trainer.fit`` in
``gpuopt.track(model=module)`` works as well when there is no ``MLFlowLogger``.)

The trainer's own settings fill what the callback's options leave unset, as
``TrainingArguments`` do for the transformers callback: ``accumulate_grad_batches`` (the
gradient accumulation), ``precision`` (``bf16-mixed``/``bf16-true`` -> bf16,
``16-mixed``/``16-true`` -> fp16, ``transformer-engine`` -> fp8), the strategy of a
multi-process trainer (DDP, FSDP, DeepSpeed's ZeRO stage) and the CUDA device of this process.

Steps: with one optimizer, each of its steps (automatic optimization, accumulation included,
or manual). With several (a GAN's generator and discriminator under manual optimization),
each training batch is one step, profiled whole, from ``on_train_batch_start`` to
``on_train_batch_end``; ``GpuOptCallback(optimizer=...)`` names the optimizer whose steps
end a training step instead (the object or its index in ``trainer.optimizers``).
"""

from __future__ import annotations

import logging
from typing import Any

from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.tracker import Tracker

logger = logging.getLogger(__name__)


def _base() -> type:
    try:
        import lightning.pytorch as pl

        return pl.Callback
    except ImportError:  # the standalone pytorch_lightning package
        import pytorch_lightning as pl

        return pl.Callback


def model_that_runs(pl_module: Any) -> Any:
    """The module whose forward the training step calls: ``pl_module``, or, when it defines
    no ``forward`` of its own, its only child with parameters (else ``pl_module``, and the
    tracker warns that the forward never ran)."""
    for cls in type(pl_module).__mro__:
        if "forward" in cls.__dict__:
            if cls.__module__.split(".")[0] not in ("lightning", "pytorch_lightning", "torch"):
                return pl_module  # the user's own forward
            break
    children = [m for m in pl_module.children() if next(m.parameters(), None) is not None]
    return children[0] if len(children) == 1 else pl_module


def mlflow_logger_run_id(trainer: Any) -> str | None:
    """The run id of the trainer's first ``MLFlowLogger``, if it has one."""
    for lg in getattr(trainer, "loggers", None) or []:
        if type(lg).__name__ == "MLFlowLogger":
            try:
                return lg.run_id
            except Exception as exc:
                logger.warning("gpuopt: could not read the MLFlowLogger's run: %s", exc)
    return None


def precision_of(trainer_precision: Any) -> str | None:
    """The gpuopt precision of a Lightning ``Trainer.precision`` string (``None``: full
    precision, left to what the profile sees)."""
    p = str(trainer_precision or "")
    if p.startswith("transformer-engine"):
        return "fp8"
    if "bf16" in p:
        return "bf16"
    if p.startswith("16"):
        return "fp16"
    return None


def strategy_of(trainer: Any) -> str | None:
    """The gpuopt strategy of a multi-process trainer (``None`` for one process)."""
    if int(getattr(trainer, "world_size", 1) or 1) <= 1:
        return None
    strategy = getattr(trainer, "strategy", None)
    name = type(strategy).__name__
    if name.startswith("DeepSpeed"):
        config = getattr(strategy, "config", None) or {}
        stage = (config.get("zero_optimization") or {}).get("stage")
        return f"zero{stage}" if stage in (1, 2, 3) else "ddp"
    if "FSDP" in name:
        return "fsdp"
    return "ddp" if "DDP" in name else None


def config_from_trainer(trainer: Any, config: TrackConfig) -> TrackConfig:
    """``config`` with what the ``Trainer`` says filled in where it says nothing."""
    automatic = getattr(getattr(trainer, "lightning_module", None),
                        "automatic_optimization", True)
    accumulate = getattr(trainer, "accumulate_grad_batches", None) if automatic else None
    root = getattr(getattr(trainer, "strategy", None), "root_device", None)
    gpu = (root.index,) if getattr(root, "type", None) == "cuda" and root.index is not None \
        else None
    derived = {"grad_accum": accumulate if isinstance(accumulate, int) else None,
               "precision": precision_of(getattr(trainer, "precision", None)),
               "strategy": strategy_of(trainer), "gpu_indices": gpu}
    return TrackConfig.from_kwargs(config, {k: v for k, v in derived.items()
                                            if v is not None and getattr(config, k) is None})


class GpuOptCallback(_base()):  # type: ignore[misc]
    """Starts tracking when training starts and stops it when training ends (or fails).

    Args:
        config, kwargs: :class:`TrackConfig` options (they win over the trainer's settings).
        optimizer: the optimizer whose steps end a training step, or its index in
            ``trainer.optimizers`` (default: the only one; with several, each batch).
    """

    def __init__(self, config: TrackConfig | None = None, *, optimizer: Any = None,
                 **kwargs: Any) -> None:
        super().__init__()
        self.config = TrackConfig.from_kwargs(config, kwargs)
        self.optimizer = optimizer
        self.tracker: Tracker | None = None
        self._per_batch = False  # each training batch is one step (several optimizers)

    def _clock_optimizer(self, optimizers: list) -> Any:
        if isinstance(self.optimizer, int) and not isinstance(self.optimizer, bool):
            return optimizers[self.optimizer]
        if self.optimizer is not None:
            return self.optimizer
        return optimizers[0] if len(optimizers) == 1 else None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            run_id = self.config.run_id or mlflow_logger_run_id(trainer)
            optimizers = list(getattr(trainer, "optimizers", None) or [])
            model = model_that_runs(pl_module)
            config = config_from_trainer(trainer, TrackConfig.from_kwargs(self.config, {
                "run_id": run_id, "name": self.config.name or type(pl_module).__name__}))
            optimizer = self._clock_optimizer(optimizers)
            self._per_batch = optimizer is None and len(optimizers) > 1
            self.tracker = Tracker(model, optimizer, config=config).start()
        except Exception as exc:  # never break training
            logger.warning("gpuopt: tracking could not start: %s", exc)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        if self._per_batch and self.tracker is not None:
            self.tracker.begin_step(batch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._per_batch and self.tracker is not None:
            self.tracker.step()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None:
            self.tracker.stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.tracker is not None:
            self.tracker.stop(failed=True)
