"""A tiny PyTorch DDP job (gloo, CPU): 20 steps of linear regression; rank 0 reports through return.json."""

import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    true_w = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    losses = []
    for _ in range(20):
        x = torch.randn(32, 8, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(
        f"rank={rank} world_size={world} node_rank={os.environ['SKYPILOT_NODE_RANK']} "
        f"first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f}",
        flush=True,
    )
    with open(os.path.join(os.environ["AIRFLOW_SKY_XCOM_DIR"], "return.json"), "w") as f:
        json.dump({"rank": rank, "world_size": world, "first_loss": losses[0], "last_loss": losses[-1]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
