"""``transformers.Trainer``: a callback that tracks ``trainer.train()`` into its MLflow run.

    from mlflow_gpuopt.integrations.transformers import GpuOptCallback
    args = TrainingArguments(..., report_to=["mlflow"], run_name="my-run")
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[GpuOptCallback()]).train()

Tracking starts at the first training step, after every callback's ``on_train_begin`` ran,
so it joins the run transformers' ``MLflowCallback`` opened (and keeps its ``run_name``),
whatever the order of the callbacks; without ``report_to=["mlflow"]`` it opens a run named
``args.run_name``. The micro-batch (``per_device_train_batch_size``), gradient accumulation
(``gradient_accumulation_steps``) and precision (``bf16``/``fp16``) come from the
``TrainingArguments``; options given to the callback win over them. The trainer's optimizer
is accelerate's wrapper; the step clock follows the optimizer inside it. In a torchrun job
every rank tracks (rank 0 logs the job). ``Trainer`` has no event for a failed ``train()``:
after one, call ``callback.tracker.stop(failed=True)`` (the next ``train()`` does so too).
"""

from __future__ import annotations

import logging
from typing import Any

from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.tracker import Tracker

logger = logging.getLogger(__name__)


def _base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


def config_from_args(args: Any, config: TrackConfig) -> TrackConfig:
    """``config`` with what the ``TrainingArguments`` say filled in where it says nothing."""
    precision = "bf16" if getattr(args, "bf16", False) else (
        "fp16" if getattr(args, "fp16", False) else None)
    strategy = "fsdp" if getattr(args, "fsdp", None) and getattr(args, "world_size", 1) > 1 \
        else None
    derived = {
        "micro_batch": getattr(args, "per_device_train_batch_size", None),
        "grad_accum": getattr(args, "gradient_accumulation_steps", None),
        "precision": precision,
        "strategy": strategy,
        "run_name": getattr(args, "run_name", None),
    }
    return TrackConfig.from_kwargs(config, {k: v for k, v in derived.items()
                                            if v is not None and getattr(config, k) is None})


class GpuOptCallback(_base()):  # type: ignore[misc]
    """Tracks ``Trainer.train()`` from its first step to ``on_train_end``.

    Args:
        config, kwargs: :class:`TrackConfig` options (they win over the ``TrainingArguments``).
    """

    def __init__(self, config: TrackConfig | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.config = TrackConfig.from_kwargs(config, kwargs)
        self.tracker: Tracker | None = None
        self._started = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        tracker, self.tracker = self.tracker, None
        self._started = False
        if tracker is not None:  # the previous train() raised before on_train_end
            tracker.stop(failed=True)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._started:
            return
        self._started = True
        try:
            config = config_from_args(args, self.config)
            self.tracker = Tracker(kwargs.get("model"), kwargs.get("optimizer"),
                                   config=config).start()
        except Exception as exc:  # never break training
            logger.warning("gpuopt: tracking could not start: %s", exc)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._started = False
        tracker, self.tracker = self.tracker, None
        if tracker is not None:
            tracker.stop()
