"""Data-parallel training with PyTorch DDP, its gradients through ina or through Gloo.

Started by torchrun (one process per rank; several hosts or network namespaces with
``--nnodes``), it reads its rank and world size from the environment torchrun sets, and with
``--comm ina`` its switch from ``INA_CONTROLLER``/``INA_JOB`` or ``INA_SWITCH``/``INA_BIND``/
``INA_JOB_ID`` (see ina.torch.communicator_from_env)::

    torchrun --nproc-per-node 4 examples/train.py --comm ina --model digits --out run.json

Models:
  digits  a small MLP on scikit-learn's digits (1797 8x8 images, shipped with the package):
          accuracy and loss per epoch.
  wide    a communication-bound MLP (``--width``; 2048 gives 16.8 M parameters) on random
          data with small batches: time per step.

Rank 0 writes a JSON report to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn


def digits_data(rank: int, world: int):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    # Each rank trains on its shard of the training set.
    shard = slice(rank, None, world)
    return (
        torch.from_numpy(x_train[shard]),
        torch.from_numpy(y_train[shard]).long(),
        torch.from_numpy(x_test),
        torch.from_numpy(y_test).long(),
    )


def digits_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def wide_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width), nn.ReLU(), nn.Linear(width, 10))


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comm", choices=["ina", "gloo"], required=True, help="where gradients are summed")
    ap.add_argument("--model", choices=["digits", "wide"], default="digits")
    ap.add_argument("--epochs", type=int, default=30, help="digits: epochs")
    ap.add_argument("--steps", type=int, default=12, help="wide: timed steps (after 2 untimed)")
    ap.add_argument("--width", type=int, default=2048, help="wide: layer width")
    ap.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket size")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = digits_model() if args.model == "digits" else wide_model(args.width)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    if args.comm == "ina":
        import ina.torch

        comm = ina.torch.communicator_from_env(rank=rank, world_size=world, give_up=30.0)
        ddp.register_comm_hook(ina.torch.HookState(comm), ina.torch.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    report: dict = {"comm": args.comm, "model": args.model, "world": world,
                    "parameters": sum(p.numel() for p in model.parameters())}

    if args.model == "digits":
        x, y, x_test, y_test = digits_data(rank, world)
        g = torch.Generator().manual_seed(rank)
        epochs = []
        for epoch in range(args.epochs):
            order = torch.randperm(len(x), generator=g)
            losses = []
            # The same number of steps on every rank (shards differ by at most one sample).
            steps = len(x) // args.batch
            for s in range(steps):
                idx = order[s * args.batch:(s + 1) * args.batch]
                loss = nn.functional.cross_entropy(ddp(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            # The mean training loss over the ranks, and the test accuracy (same model on all).
            mean = torch.tensor([float(np.mean(losses))])
            dist.all_reduce(mean)
            with torch.no_grad():
                test_loss = nn.functional.cross_entropy(model(x_test), y_test).item()
                acc = (model(x_test).argmax(1) == y_test).float().mean().item()
            epochs.append({"epoch": epoch, "train_loss": mean.item() / world, "test_loss": test_loss, "test_accuracy": acc})
        report["epochs"] = epochs
    else:
        g = torch.Generator().manual_seed(rank)
        xs = torch.randn(args.batch, args.width, generator=g)
        ys = torch.randint(0, 10, (args.batch,), generator=g)
        times, cpus = [], []
        for step in range(args.steps + 2):
            dist.barrier()
            t0, c0 = time.perf_counter(), cpu_seconds()
            loss = nn.functional.cross_entropy(ddp(xs), ys)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= 2:
                times.append(time.perf_counter() - t0)
                cpus.append(cpu_seconds() - c0)
        # Compute alone: the same step without the gradient sum.
        t0 = time.perf_counter()
        for _ in range(3):
            with ddp.no_sync():
                loss = nn.functional.cross_entropy(ddp(xs), ys)
                opt.zero_grad()
                loss.backward()
        report["compute_s"] = (time.perf_counter() - t0) / 3
        report["step_s"] = times
        report["step_cpu_s"] = cpus
        report["median_step_s"] = float(np.median(times))
        report["median_step_cpu_s"] = float(np.median(cpus))
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    report["param_checksum"] = float(params.double().sum())
    checks = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(checks, torch.tensor([report["param_checksum"]], dtype=torch.float64))
    report["ranks_identical"] = all(c.item() == checks[0].item() for c in checks)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
