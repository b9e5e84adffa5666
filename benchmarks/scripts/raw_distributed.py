"""The raw ``torch.distributed`` loop that blocks' DDP and FSDP are timed against (run under torchrun).

The same decoder as ``model=transformer`` (its module, not blocks' training code), random tokens,
AdamW; DDP wraps the model, FSDP2 shards each layer then the root. Rank 0 prints one JSON line
with the global samples/s of the steps after warmup.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from blocks.model.networks import Decoder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("ddp", "fsdp"), required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Decoder(
        vocab_size=args.vocab,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        context=args.seq,
        mlp_ratio=4,
        dropout=0.0,
        tie_weights=True,
    )
    if args.mode == "ddp":
        model = DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    started = 0.0
    for step in range(args.steps):
        if step == args.warmup:
            dist.barrier()
            started = time.perf_counter()
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            loss.item()
    dist.barrier()
    elapsed = time.perf_counter() - started
    if rank == 0:
        samples = (args.steps - args.warmup) * args.batch * world
        print(json.dumps({"samples_per_s": samples / elapsed, "pid": os.getpid()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
