"""A HuggingFace `transformers.TrainerCallback` that reports each rank's step, and its logs as metrics.

    from airflow_sky.progress.hf import ProgressCallback
    trainer = Trainer(..., callbacks=[ProgressCallback()])

transformers is imported when ProgressCallback is first used, not with this module's package.
"""

from __future__ import annotations

from typing import Any

from airflow_sky.progress.callbacks import install_hint, loggable_metrics, step_total
from airflow_sky.progress.reporter import DEFAULT_INTERVAL_S, Reporter


def callback_class(base: type) -> type:
    """ProgressCallback on `base` (transformers.TrainerCallback; tests give a stand-in with its shape)."""

    class ProgressCallback(base):
        """Reports `state.global_step` of `state.max_steps` at each step's end, with the Trainer's logs
        (loss, learning_rate, grad_norm, ...) when it logs; at most one line per `min_interval_s`."""

        def __init__(self, min_interval_s: float = DEFAULT_INTERVAL_S, reporter: Reporter | None = None):
            super().__init__()
            self.reporter = reporter if reporter is not None else Reporter(min_interval_s=min_interval_s)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.report(state.global_step, step_total(state.max_steps))

        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
        ) -> None:
            self.reporter.report(state.global_step, step_total(state.max_steps), **loggable_metrics(logs))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.flush()

    return ProgressCallback


def __getattr__(name: str) -> Any:
    if name != "ProgressCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from transformers import TrainerCallback
    except ImportError as e:
        raise ImportError(install_hint("hf", "transformers")) from e
    cls = callback_class(TrainerCallback)
    globals()[name] = cls
    return cls
