"""Entry point: char-level minGPT trained with PyTorch DDP under torchrun (one process per node on CPU).

Launch (see train.yaml):  torchrun --nnodes=N --nproc_per_node=1 --master_addr=... --node_rank=R main.py
Everything is configured through environment variables (README.md lists them and their defaults).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from char_dataset import CharDataset
from model import GPT, GPTConfig
from trainer import Stopped, TrainConfig, Trainer, TrainResult, log

DATA = Path(__file__).resolve().parent / "data" / "input.txt"  # found from any cwd (~/sky_workdir on a node)


def env_int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SystemExit(f"{name}={value} must be >= {minimum}")
    return value


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise SystemExit(f"{name}={value} must be > 0")
    return value


def read_config(vocab_size: int) -> tuple[GPTConfig, TrainConfig]:
    """Model and training settings from the environment; read before any collective so bad input fails fast."""
    model_cfg = GPTConfig(
        vocab_size=vocab_size,
        block_size=env_int("BLOCK_SIZE", 64),
        n_layer=env_int("N_LAYER", 2),
        n_head=env_int("N_HEAD", 4),
        n_embd=env_int("N_EMBD", 128),
    )
    if model_cfg.n_embd % model_cfg.n_head:
        raise SystemExit(f"N_EMBD={model_cfg.n_embd} must be divisible by N_HEAD={model_cfg.n_head}")
    train_cfg = TrainConfig(
        max_steps=env_int("MAX_STEPS", 300),
        snapshot_every=env_int("SNAPSHOT_EVERY", 50, minimum=0),
        batch_size=env_int("BATCH_SIZE", 32),
        lr=env_float("LR", 3e-3),
        log_every=env_int("LOG_EVERY", 25),
        seed=env_int("SEED", 1337, minimum=0),
        snapshot_path=Path(os.environ.get("SNAPSHOT_PATH") or "gpt_snapshot.pt").resolve(),
    )
    return model_cfg, train_cfg


def setup_distributed() -> torch.device:
    """Join the torchrun group: NCCL on GPUs (one per local rank), gloo on CPU."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo")
    log(
        f"world_size={dist.get_world_size()} node_rank={os.environ.get('SKYPILOT_NODE_RANK', '?')} "
        f"local_rank={os.environ.get('LOCAL_RANK', '?')} backend={dist.get_backend()} device={device} "
        f"torch={torch.__version__}"
    )
    return device


def report(trainer: Trainer, dataset: CharDataset, result: TrainResult, seed: int) -> None:
    """Rank 0: a generated sample, the final loss, and return.json for Airflow's XCom when asked for."""
    prompt = dataset.encode("The ").unsqueeze(0).to(trainer.device)
    trainer.raw_model.eval()
    out = trainer.raw_model.generate(prompt, 200, torch.Generator().manual_seed(seed))
    log("sample:")
    for line in dataset.decode(out[0]).splitlines():
        log(f"| {line}")
    log(f"final loss {result.final_loss:.4f} (first {result.first_loss:.4f}) after {result.steps} steps")
    xcom_dir = os.environ.get("AIRFLOW_SKY_XCOM_DIR")
    if xcom_dir:
        payload = {
            "final_loss": result.final_loss,
            "first_loss": result.first_loss,
            "steps": result.steps,
            "world_size": dist.get_world_size(),
            "snapshot": str(trainer.cfg.snapshot_path),
        }
        target = Path(xcom_dir) / "return.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, target)


def main() -> int:
    if not DATA.is_file():
        raise SystemExit(f"corpus not found: {DATA}")
    torch.set_num_threads(env_int("TORCH_THREADS", 1))  # N processes on N cores: no oversubscription
    text = DATA.read_text(encoding="utf-8")
    vocab_size = len(set(text))
    model_cfg, train_cfg = read_config(vocab_size)
    device = setup_distributed()
    try:
        torch.manual_seed(train_cfg.seed)  # same init on every rank; DDP broadcasts rank 0's anyway
        dataset = CharDataset(text, model_cfg.block_size)
        model = GPT(model_cfg)
        if dist.get_rank() == 0:
            log(
                f"corpus {len(text)} chars, vocab {vocab_size}, model {model.num_params() / 1e3:.1f}K params, "
                f"{model_cfg.n_layer} layers x {model_cfg.n_head} heads x {model_cfg.n_embd} dims, "
                f"block {model_cfg.block_size}, batch {train_cfg.batch_size}/rank, lr {train_cfg.lr}, "
                f"steps {train_cfg.max_steps}, snapshot every {train_cfg.snapshot_every} to {train_cfg.snapshot_path}"
            )
        trainer = Trainer(model, dataset, train_cfg, device)
        # A spot node's preemption notice (airflow-sky sends SIGTERM after the preemption hooks) or a cancel:
        # finish the step, snapshot, exit. The next generation resumes from that step: nothing is redone.
        signal.signal(signal.SIGTERM, lambda *_: setattr(trainer, "stop_requested", True))
        try:
            result = trainer.train()
        except Stopped:
            return 128 + signal.SIGTERM
        if dist.get_rank() == 0:
            report(trainer, dataset, result, train_cfg.seed)
        dist.barrier()  # every rank leaves together, after rank 0's report
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
