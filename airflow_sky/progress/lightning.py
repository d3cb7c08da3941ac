"""A Lightning `Callback` that reports each rank's step, with the logged metrics (`self.log(...)`).

    from airflow_sky.progress.lightning import ProgressCallback
    trainer = lightning.Trainer(..., callbacks=[ProgressCallback()])

Lightning (`lightning`, else the older `pytorch_lightning`) is imported when ProgressCallback is first
used, not with this module's package.
"""

from __future__ import annotations

import importlib
from typing import Any

from airflow_sky.progress.callbacks import install_hint, loggable_metrics, step_total
from airflow_sky.progress.reporter import DEFAULT_INTERVAL_S, Reporter


def callback_class(base: type) -> type:
    """ProgressCallback on `base` (lightning.pytorch.Callback; tests give a stand-in with its shape)."""

    class ProgressCallback(base):
        """Reports `trainer.global_step` of the planned steps after every training batch, with
        `trainer.callback_metrics`; at most one line per `min_interval_s`, and the metrics (a device sync
        each) are read only when a line is due."""

        def __init__(self, min_interval_s: float = DEFAULT_INTERVAL_S, reporter: Reporter | None = None):
            super().__init__()
            self.reporter = reporter if reporter is not None else Reporter(min_interval_s=min_interval_s)
            self.total: int | None = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            # Read once: Lightning works the estimate out from the dataloaders.
            self.total = step_total(trainer.estimated_stepping_batches)

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            metrics = loggable_metrics(trainer.callback_metrics) if self.reporter.due() else {}
            self.reporter.report(trainer.global_step, self.total, **metrics)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.reporter.report(
                trainer.global_step, self.total, **loggable_metrics(trainer.callback_metrics)
            )
            self.reporter.flush()

    return ProgressCallback


def _lightning_callback() -> type:
    for module in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return importlib.import_module(module).Callback
        except ImportError:
            continue
    raise ImportError(install_hint("lightning", "lightning"))


def __getattr__(name: str) -> Any:
    if name != "ProgressCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = callback_class(_lightning_callback())
    globals()[name] = cls
    return cls
