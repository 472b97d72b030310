"""CUDA tensors through the hook's pinned staging (needs a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import ina  # noqa: E402
import torch_ranks  # noqa: E402
from conftest import free_tcp_port, run_ranks  # noqa: E402


def cuda_train(kw: dict, port: int, steps: int):
    import torch.distributed as dist
    import torch.nn as nn

    import ina.torch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=kw["rank"], world_size=kw["world_size"])
    m = torch_ranks.model().cuda()
    ddp = nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.1)
    ddp.register_comm_hook(ina.torch.HookState(ina.Communicator(**kw)), ina.torch.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(kw["rank"])
    out = []
    for _ in range(steps):
        x = torch.randn(32, 64, generator=g).cuda()
        y = torch.randint(0, 10, (32,), generator=g).cuda()
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(torch.cat([p.detach().reshape(-1) for p in m.parameters()]).cpu().numpy())
    dist.destroy_process_group()
    return out


def test_cuda_buckets_go_through_pinned_staging(switch):
    sw = switch(2)
    port = free_tcp_port()
    runs = run_ranks(cuda_train, [(sw.kwargs(r), port, 3) for r in range(2)])
    for step in range(3):
        assert np.array_equal(runs[0][step], runs[1][step])


def test_communicator_refuses_a_cuda_tensor(switch):
    sw = switch(1)
    comm = ina.Communicator(**sw.kwargs(0))
    with pytest.raises(TypeError, match="cuda tensor"):
        comm.allreduce(torch.ones(4, device="cuda"))
