"""An open_clip-style training script on raydist's drop-in ``distributed`` helpers.

The script keeps open_clip's shape: an argparse namespace that
``init_distributed_device(args)`` fills in (rank, local_rank, world_size,
distributed, device), ``is_master(args)`` around printing, and the object
helpers ``broadcast_object`` / ``all_gather_object``. The only change from
open_clip is the import line. It trains a tiny two-tower contrastive model
(CLIP's loss, on synthetic pairs) with DDP, and runs alone, under torchrun
and under ``raydist run``:

    python examples/open_clip_style.py
    torchrun --standalone --nproc-per-node 2 examples/open_clip_style.py --steps 20
    raydist run -n 2 examples/open_clip_style.py --steps 20
"""

from __future__ import annotations

import argparse
import gc
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from raydist import compat as distributed
from raydist import shutdown


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, npu, ... (falls back to cpu when unavailable)")
    parser.add_argument("--dist-backend", default=None, help="default: the device's (gloo on CPU, nccl on CUDA)")
    parser.add_argument("--dist-url", default=None, help="init method; default: env:// (the launcher's variables)")
    parser.add_argument("--horovod", action="store_true", help="use horovod instead of torch.distributed")
    parser.add_argument("--no-set-device-rank", action="store_true", help="keep the device index as given")
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--batch-size", type=int, default=16, help="pairs per rank per step")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    return parser.parse_args(argv)


class TwoTower(torch.nn.Module):
    """An "image" and a "text" encoder into one embedding space, with CLIP's learnt temperature."""

    def __init__(self, image_dim: int = 12, text_dim: int = 8, embed_dim: int = 16):
        super().__init__()
        self.image = torch.nn.Linear(image_dim, embed_dim)
        self.text = torch.nn.Linear(text_dim, embed_dim)
        self.logit_scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, images: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
        image_features = F.normalize(self.image(images), dim=-1)
        text_features = F.normalize(self.text(texts), dim=-1)
        logits = self.logit_scale.exp() * image_features @ text_features.T
        labels = torch.arange(len(images), device=images.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def train(args: argparse.Namespace, device: torch.device, config: Dict[str, Any]) -> float:
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model: torch.nn.Module = TwoTower().to(device)
    if args.distributed:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    data = torch.Generator().manual_seed(args.seed * 1000 + args.rank)  # this rank's shard
    mixing = torch.randn(12, 8, generator=torch.Generator().manual_seed(args.seed))  # how pairs relate
    loss = torch.zeros(())
    for step in range(config["steps"]):
        images = torch.randn(args.batch_size, 12, generator=data)
        texts = images @ mixing + 0.1 * torch.randn(args.batch_size, 8, generator=data)
        loss = model(images.to(device), texts.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if distributed.is_master(args) and step % max(1, config["steps"] // 4) == 0:
            print(f"step {step}: contrastive loss {loss.item():.4f}", flush=True)
    result = loss.item()
    # Free DDP before leaving the process group (torch can abort at exit otherwise).
    del model, optimizer
    gc.collect()
    return result


def main() -> None:
    args = parse_args()
    device = distributed.init_distributed_device(args)
    if distributed.is_master(args):
        print(f"world size {args.world_size}, device {device}, distributed {args.distributed}", flush=True)

    # Rank 0 decides the run's settings; every rank uses the same ones.
    config = {"lr": args.lr, "steps": args.steps, "name": f"open-clip-style-seed{args.seed}"}
    config = distributed.broadcast_object(args, config if distributed.is_master(args) else None)
    print(f"rank {args.rank} (local rank {args.local_rank}) got config {config['name']}", flush=True)

    final_loss = train(args, device, config)

    reports = distributed.all_gather_object(args, {"rank": args.rank, "loss": round(final_loss, 4)})
    if distributed.is_master(args):
        print(f"gathered from ranks {[r['rank'] for r in reports]}", flush=True)
        print(f"final losses: {[r['loss'] for r in reports]}", flush=True)
    shutdown()  # leave the process group raydist's helpers joined


if __name__ == "__main__":
    main()
