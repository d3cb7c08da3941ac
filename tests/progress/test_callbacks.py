"""The HuggingFace and Lightning callbacks report steps and logged metrics.

transformers and lightning are optional extras, not dev dependencies: the stand-in tests build each
callback on a stand-in base class and feed it objects with the attributes the framework hands a callback
(TrainerState's global_step/max_steps and a logs dict; Lightning's Trainer global_step,
estimated_stepping_batches and callback_metrics); that is a stand-in because the frameworks are not
installed here. Where a framework is installed, the tests after them train a tiny model with the real
Trainer (skipped otherwise).
"""

from __future__ import annotations

import io
import math
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_sky.progress import Report, Reporter, hf, lightning, parse_line


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CallbackBase:
    """Stands in for transformers.TrainerCallback / lightning.pytorch.Callback: a plain base class."""


def _reports(out: io.StringIO) -> list[Report]:
    return [r for r in map(parse_line, out.getvalue().splitlines()) if r is not None]


def test_hf_callback_reports_steps_and_the_trainers_logs() -> None:
    clock, out = Clock(), io.StringIO()
    callback = hf.callback_class(CallbackBase)(reporter=Reporter(1.0, stream=out, rank=0, clock=clock))
    state = SimpleNamespace(global_step=0, max_steps=20)
    for step in range(1, 21):
        state.global_step = step
        clock.now += 0.4
        callback.on_step_end(None, state, None)
        if step % 5 == 0:  # the Trainer logs after the step's end: its logs reach the next line written
            callback.on_log(
                None,
                state,
                None,
                logs={"loss": 3.0 - step / 10, "learning_rate": 1e-3, "epoch": 0.5, "note": "x"},
            )
    callback.on_train_end(None, state, None)
    reports = _reports(out)
    # At most one line a second; the logs keep the step they were logged at; the last step at once.
    assert [(r.step, "loss" in r.metrics) for r in reports] == [
        (1, False),
        (4, False),
        (5, True),
        (10, False),
        (10, True),
        (15, True),
        (19, False),
        (20, False),
        (20, True),
    ]
    assert reports[-1] == Report(
        20, 20, {"loss": 1.0, "learning_rate": 1e-3, "epoch": 0.5}, 0, reports[-1].time
    )
    assert dict(reports[2].metrics) == {"loss": 2.5, "learning_rate": 1e-3, "epoch": 0.5}


def test_hf_callback_without_a_known_max_steps_reports_no_total() -> None:
    out = io.StringIO()
    callback = hf.callback_class(CallbackBase)(reporter=Reporter(0, stream=out, rank=0))
    callback.on_step_end(None, SimpleNamespace(global_step=3, max_steps=0), None)
    assert _reports(out)[0].total is None


def test_lightning_callback_reports_steps_and_reads_metrics_only_when_a_line_is_due() -> None:
    clock, out = Clock(), io.StringIO()
    reads = []

    class Metrics(dict):  # counts reads of callback_metrics (each is a device sync in Lightning)
        def items(self):  # type: ignore[no-untyped-def]
            reads.append(1)
            return super().items()

    callback = lightning.callback_class(CallbackBase)(reporter=Reporter(1.0, stream=out, rank=1, clock=clock))
    trainer = SimpleNamespace(
        global_step=0, estimated_stepping_batches=float("inf"), callback_metrics=Metrics()
    )
    callback.on_train_start(trainer, None)
    assert callback.total is None  # an endless run has no total
    trainer.estimated_stepping_batches = 12
    callback.on_train_start(trainer, None)
    for step in range(1, 11):
        trainer.global_step = step
        trainer.callback_metrics = Metrics(train_loss=2.0 / step, bad=[1, 2], **{"val acc": 0.5})
        clock.now += 0.5
        callback.on_train_batch_end(trainer, None, None, None, step - 1)
    callback.on_train_end(trainer, None)
    reports = _reports(out)
    assert [r.step for r in reports] == [1, 3, 5, 7, 9, 10]
    assert all(r.total == 12 and r.rank == 1 for r in reports)
    assert reports[1].metrics == {"train_loss": 2.0 / 3}
    assert len(reads) == 5 + 1  # the due batches and the end, not every batch


def test_missing_frameworks_raise_an_import_error_with_the_extra_to_install(monkeypatch) -> None:
    for module in ("transformers", "lightning", "lightning.pytorch", "pytorch_lightning"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    for extra, mod in (("hf", hf), ("lightning", lightning)):
        mod.__dict__.pop("ProgressCallback", None)
        with pytest.raises(ImportError, match=rf"pip install 'airflow-sky\[{extra}\]'"):
            mod.ProgressCallback  # noqa: B018
    with pytest.raises(AttributeError):
        hf.Other  # noqa: B018


def test_real_hf_trainer_reports_through_the_callback(tmp_path, monkeypatch) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    torch = pytest.importorskip("torch")
    from airflow_sky.progress.hf import ProgressCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Linear(2, 1)

        def forward(self, x: Any, y: Any) -> dict[str, Any]:
            return {"loss": torch.nn.functional.mse_loss(self.w(x).squeeze(-1), y)}

    data = [{"x": torch.tensor([float(i), 1.0]), "y": torch.tensor(2.0 * i)} for i in range(16)]
    out = io.StringIO()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=8,
        per_device_train_batch_size=4,
        logging_steps=2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    callback = ProgressCallback(reporter=Reporter(0, stream=out, rank=0))
    assert isinstance(callback, transformers.TrainerCallback)
    transformers.Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[callback]).train()
    reports = _reports(out)
    assert [r.step for r in reports if not r.metrics][:3] == [1, 2, 3]
    logged = [r for r in reports if "loss" in r.metrics]
    assert [r.step for r in logged][:4] == [2, 4, 6, 8] and all(r.total == 8 for r in reports)
    assert all(math.isfinite(r.metrics["loss"]) for r in logged)


def test_real_lightning_trainer_reports_through_the_callback(tmp_path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    torch = pytest.importorskip("torch")
    from airflow_sky.progress.lightning import ProgressCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.w(x).squeeze(-1), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    xs = torch.stack([torch.tensor([float(i), 1.0]) for i in range(16)])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, 2.0 * xs[:, 0]), batch_size=4)
    out = io.StringIO()
    callback = ProgressCallback(reporter=Reporter(0, stream=out, rank=0))
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=str(tmp_path),
    )
    trainer.fit(Tiny(), loader)
    reports = _reports(out)
    assert [r.step for r in reports] == [1, 2, 3, 4, 5, 6, 7, 8, 8]
    assert all(r.total == 8 for r in reports) and "train_loss" in reports[-1].metrics
