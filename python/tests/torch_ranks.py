"""What each rank process of the PyTorch tests runs (importable by spawned processes)."""

from __future__ import annotations

import os
import time
import warnings

import numpy as np


def model():
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def embedding_model():
    """An embedding table of 20000 rows of 32 (its gradient: the rows a batch touched) under a
    small classifier."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(20000, 32), nn.Flatten(), nn.Linear(4 * 32, 10))


def params(m) -> np.ndarray:
    import torch

    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy().copy()


def train(mode: str, kw: dict, store_port: int, steps: int, give_up: float = 5.0, kill_switch_pid: int | None = None):
    """Trains the model for `steps` steps with DDP on rank data of its own; returns the
    parameters after each step (and what the mode checks besides)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import ina
    import ina.torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, extra = _train(mode, kw, store_port, steps, give_up, kill_switch_pid)
    extra["warnings"] = [str(w.message) for w in caught if "ina" in str(w.message)]
    return out, extra


def _train(mode, kw, store_port, steps, give_up, kill_switch_pid):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import ina
    import ina.torch

    rank, world = kw["rank"], kw["world_size"]
    init = f"tcp://127.0.0.1:{store_port}"
    if mode == "backend":
        os.environ.update(INA_SWITCH=kw["switch"], INA_BIND=kw["bind"], INA_JOB_ID=str(kw["job"]))
        dist.init_process_group("cpu:ina", init_method=init, rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    embedding = mode in ("embedding", "embedding-gloo")
    m = embedding_model() if embedding else model()
    ddp = nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.1)
    extra: dict = {}
    state = None
    if mode in ("hook", "fallback", "no-fallback", "embedding"):
        comm = ina.Communicator(**{**kw, "give_up": give_up})
        fallback = dist.new_group(backend="gloo") if mode == "fallback" else None
        state = ina.torch.HookState(comm, fallback=fallback)
        ddp.register_comm_hook(state, ina.torch.allreduce_hook)
    if kill_switch_pid is not None:
        dist.barrier()
        if rank == 0:
            os.kill(kill_switch_pid, 9)
        time.sleep(0.5)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(steps):
        if embedding:
            # Each sample: 4 rows, from 50 popular ones and 50 of the rank's own.
            popular = torch.randint(0, 50, (32, 2), generator=g)
            own = torch.randint(0, 50, (32, 2), generator=g) + 1000 * (rank + 1)
            x = torch.cat([popular, own], dim=1)
        else:
            x = torch.randn(32, 64, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        start = time.monotonic()
        try:
            loss.backward()
        except Exception as e:  # noqa: BLE001 - what the test checks
            extra["raised"] = f"{type(e).__name__}: {e}"
            extra["after"] = time.monotonic() - start
            break
        opt.step()
        out.append(params(m))
    if mode == "backend":
        t = torch.full((1000,), float(rank + 1))
        dist.all_reduce(t)
        i = torch.full((10,), rank + 1, dtype=torch.int32)
        dist.all_reduce(i)
        mx = torch.tensor([float(rank)])
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        b = torch.tensor([rank + 10])
        dist.broadcast(b, 0)
        extra["collectives"] = (t.tolist(), i.tolist(), mx.item(), b.item())
    if state is not None:
        extra["buckets"] = (state.buckets_sparse, state.buckets_dense)
    if "raised" not in extra:
        dist.destroy_process_group()
    return out, extra
