"""PyTorch Lightning: a callback that tracks ``trainer.fit`` into the run Lightning logs to.

    trainer = L.Trainer(logger=MLFlowLogger(...), callbacks=[GpuOptCallback()])

The run is, in order: an explicit ``run_id``; the run of the trainer's ``MLFlowLogger``; the
active run (e.g. ``mlflow.autolog()``'s); else a new one. A LightningModule that defines no
``forward`` cannot be called, so its ``training_step`` calls a submodule: when exactly one
child holds parameters (``self.net``), that child is the tracked model. (Wrapping ``trainer.fit`` in
``gpuopt.track(model=module)`` works as well when there is no ``MLFlowLogger``.)
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


class GpuOptCallback(_base()):  # type: ignore[misc]
    """Starts tracking when training starts and stops it when training ends (or fails)."""

    def __init__(self, config: TrackConfig | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.config = TrackConfig.from_kwargs(config, kwargs)
        self.tracker: Tracker | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            run_id = self.config.run_id or mlflow_logger_run_id(trainer)
            optimizers = list(getattr(trainer, "optimizers", None) or [])
            model = model_that_runs(pl_module)
            config = TrackConfig.from_kwargs(self.config, {
                "run_id": run_id, "name": self.config.name or type(pl_module).__name__})
            self.tracker = Tracker(model,
                                   optimizers[0] if len(optimizers) == 1 else None,
                                   config=config).start()
        except Exception as exc:  # never break training
            logger.warning("gpuopt: tracking could not start: %s", exc)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None:
            self.tracker.stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.tracker is not None:
            self.tracker.stop(failed=True)
