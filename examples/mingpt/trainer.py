"""DDP training loop with step-based snapshots that rank 0 writes and every rank resumes from."""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from char_dataset import CharDataset
from model import GPT
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

try:  # airflow-sky puts airflow_sky.progress on every node's PYTHONPATH; without it, progress is the log alone
    from airflow_sky.progress import report
except ImportError:

    def report(step: int, total: int | None = None, **metrics: float) -> bool:
        return False


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (the model shape lives in GPTConfig)."""

    max_steps: int
    snapshot_every: int  # 0 disables snapshots
    batch_size: int  # per rank
    lr: float
    log_every: int
    seed: int
    snapshot_path: Path
    grad_clip: float = 1.0


@dataclass(frozen=True)
class TrainResult:
    """Losses are means over ranks; first_loss is this run's first step, final_loss its last log window."""

    first_loss: float
    final_loss: float
    steps: int
    start_step: int


def log(msg: str) -> None:
    """One flushed, rank-prefixed line: logs are streamed line by line from every node."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    # One write per line: ranks share a pipe under torchrun, and print()'s separate "\n" write interleaves.
    sys.stdout.write(f"[rank {rank}/{world}] {msg}\n")
    sys.stdout.flush()


class Stopped(Exception):
    """Training stopped early on SIGTERM, after the snapshot of `step` was written."""

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped at step {step}")
        self.step = step


class Trainer:
    """Owns the DDP model, optimizer, sampler and step counter; saves and restores them as one snapshot."""

    def __init__(self, model: GPT, dataset: CharDataset, cfg: TrainConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.dataset = dataset
        self.raw_model = model.to(device)
        self.step = 0
        self.stop_requested = False  # set by SIGTERM (a preemption notice, a cancel): see train()
        snapshot = self._load_snapshot()
        if snapshot is not None:
            self.raw_model.load_state_dict(snapshot["model"])
        # DDP also broadcasts rank 0's parameters at construction, so replicas start identical either way.
        ids = [device.index] if device.type == "cuda" else None
        self.model = DistributedDataParallel(self.raw_model, device_ids=ids)
        self.optimizer = self.raw_model.configure_optimizer(cfg.lr)
        if snapshot is not None:
            self.optimizer.load_state_dict(snapshot["optimizer"])
            self.step = int(snapshot["step"])
            log(f"resuming from snapshot at step {self.step}")
        self.sampler = DistributedSampler(dataset, shuffle=True, seed=cfg.seed, drop_last=True)
        self.loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=self.sampler, drop_last=True)
        if len(self.loader) == 0:
            raise ValueError(f"BATCH_SIZE={cfg.batch_size} exceeds the {len(self.sampler)} windows per rank")

    # -- snapshots -----------------------------------------------------------------------------------
    def _snapshot_meta(self) -> dict[str, Any]:
        return {"model_config": asdict(self.raw_model.cfg), "vocab": "".join(self.dataset.chars)}

    def _load_snapshot(self) -> dict[str, Any] | None:
        """Rank 0 reads the snapshot (other nodes may have empty disks) and broadcasts it to every rank.

        Errors are broadcast too, so a bad snapshot stops all ranks with the same message instead of
        leaving the others waiting in a collective.
        """
        box: list[Any] = [None, None]  # [snapshot or None, error message or None]
        path = self.cfg.snapshot_path
        if self.rank == 0 and path.exists():
            try:
                snap = torch.load(path, map_location="cpu", weights_only=True)
                meta = self._snapshot_meta()
                for key, want in meta.items():
                    if snap.get(key) != want:
                        raise ValueError(f"{key} differs: snapshot {snap.get(key)!r}, this run {want!r}")
                box[0] = snap
            except Exception as exc:
                box[1] = f"cannot resume from {path}: {exc}. Delete it or set SNAPSHOT_PATH elsewhere."
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        if box[1] is not None:
            raise RuntimeError(box[1])
        return box[0]

    def save_snapshot(self) -> None:
        """Rank 0 writes {model, optimizer, step} to a temp file and renames it: a crash never leaves half."""
        if self.rank != 0:
            return
        path = self.cfg.snapshot_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
        snap = {
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            **self._snapshot_meta(),
        }
        torch.save(snap, tmp)
        os.replace(tmp, path)
        log(f"saved snapshot at step {self.step} to {path}")

    # -- training ------------------------------------------------------------------------------------
    def _every_rank_stops(self) -> bool:
        """Whether any rank got SIGTERM: all stop after the same step, so rank 0's snapshot is every rank's
        (a preempted node's rank learns first; the others would only see it die)."""
        flag = torch.tensor([1.0 if self.stop_requested else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

    def _global_mean(self, value: torch.Tensor) -> float:
        """The mean of a per-rank scalar over all ranks (what the DDP gradient step actually optimised)."""
        t = value.detach().clone().reshape(1).to(self.device, torch.float32)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.item() / self.world_size

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless batches that continue exactly where step `self.step` left off (epoch and offset)."""
        per_epoch = len(self.loader)
        epoch, skip = divmod(self.step, per_epoch)

        def epochs() -> Iterator[Iterator[tuple[torch.Tensor, torch.Tensor]]]:
            e = epoch
            while True:
                self.sampler.set_epoch(e)
                yield itertools.islice(self.loader, skip if e == epoch else 0, None)
                e += 1

        return itertools.chain.from_iterable(epochs())

    def train(self) -> TrainResult:
        cfg, start = self.cfg, self.step
        first_loss: float | None = None
        final_loss: float | None = None
        window, n, t0 = torch.zeros((), device=self.device), 0, time.perf_counter()
        self.model.train()
        batches = self._batches()
        while self.step < cfg.max_steps:
            x, y = next(batches)
            _, loss = self.model(x.to(self.device), y.to(self.device))
            assert loss is not None
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.optimizer.step()
            self.step += 1
            window += loss.detach()
            n += 1
            if self.step == start + 1 or self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                final_loss = self._global_mean(window / n)
                first_loss = final_loss if first_loss is None else first_loss
                rate = n / max(time.perf_counter() - t0, 1e-9)
                log(f"step {self.step}/{cfg.max_steps} loss {final_loss:.4f} ({rate:.1f} steps/s)")
                tokens = rate * cfg.batch_size * x.shape[1] * self.world_size  # the whole job's tokens/s
                report(self.step, cfg.max_steps, loss=final_loss, **{"steps/s": rate, "tokens/s": tokens})
                window, n, t0 = torch.zeros((), device=self.device), 0, time.perf_counter()
            else:
                # Every step, for a live step count; the reporter writes at most one line a second.
                report(self.step, cfg.max_steps)
            if self._every_rank_stops():
                if cfg.snapshot_every:
                    self.save_snapshot()
                log(f"stopping at step {self.step}: SIGTERM (a preemption notice or a cancel)")
                raise Stopped(self.step)
            if cfg.snapshot_every and (self.step % cfg.snapshot_every == 0 or self.step == cfg.max_steps):
                self.save_snapshot()
        if first_loss is None or final_loss is None:
            log(f"snapshot is already at step {self.step} >= MAX_STEPS={cfg.max_steps}; nothing to train")
            first_loss = final_loss = self.evaluate()
        return TrainResult(first_loss=first_loss, final_loss=final_loss, steps=self.step, start_step=start)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over ranks on one batch: the result a run that trains no steps still reports."""
        self.model.eval()
        self.sampler.set_epoch(0)
        x, y = next(iter(self.loader))
        _, loss = self.raw_model(x.to(self.device), y.to(self.device))
        assert loss is not None
        return self._global_mean(loss)
