"""PyTorch through ina: the DDP hook, the backend, failures, and torchrun with the controller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

import torch_ranks  # noqa: E402
from conftest import ina_binary, free_tcp_port, run_ranks  # noqa: E402

STEPS = 4


def train_all(sw, mode: str, **kw) -> list:
    port = free_tcp_port()
    return run_ranks(
        torch_ranks.train,
        [(mode, sw.kwargs(r), port, STEPS, *kw.get("args", ())) for r in range(sw.workers)],
        timeout=180,
    )


def test_ddp_hook_keeps_ranks_identical_and_follows_gloo(switch):
    sw = switch(4)
    ina_runs = train_all(sw, "hook")
    gloo_runs = train_all(sw, "gloo")
    for step in range(STEPS):
        first = ina_runs[0][0][step]
        for r in range(1, 4):
            assert np.array_equal(ina_runs[r][0][step], first), f"rank {r} step {step}"
        # The same training as Gloo's, up to the quantization of the gradients.
        gloo = gloo_runs[0][0][step]
        assert np.abs(first - gloo).max() < 1e-4, f"step {step}: {np.abs(first - gloo).max()}"
    # The model did move.
    assert np.abs(ina_runs[0][0][-1] - torch_ranks.params(torch_ranks.model())).max() > 1e-3
    # A dense model's buckets: sparse at first (auto has measured nothing), then dense.
    for r, (_, extra) in enumerate(ina_runs):
        sparse, dense = extra["buckets"]
        assert sparse >= 1 and dense >= STEPS - 1, f"rank {r}: {sparse} sparse, {dense} dense"


def test_the_hook_sends_an_embeddings_gradient_sparse_and_follows_gloo(switch):
    sw = switch(4)
    runs = train_all(sw, "embedding")
    gloo_runs = train_all(sw, "embedding-gloo")
    for step in range(STEPS):
        first = runs[0][0][step]
        for r in range(1, 4):
            assert np.array_equal(runs[r][0][step], first), f"rank {r} step {step}"
        gloo = gloo_runs[0][0][step]
        assert np.abs(first - gloo).max() < 1e-4, f"step {step}: {np.abs(first - gloo).max()}"
    for r, (_, extra) in enumerate(runs):
        sparse, dense = extra["buckets"]
        # The bucket of the embedding (a few hundred of its 20000 rows touched) goes sparse
        # every step.
        assert sparse >= STEPS and dense == 0, f"rank {r}: {sparse} sparse, {dense} dense"


def test_backend_sums_through_ina_and_delegates_the_rest_to_gloo(switch):
    sw = switch(4)
    runs = train_all(sw, "backend")
    gloo_runs = train_all(sw, "gloo")
    for step in range(STEPS):
        for r in range(1, 4):
            assert np.array_equal(runs[r][0][step], runs[0][0][step])
        assert np.abs(runs[0][0][step] - gloo_runs[0][0][step]).max() < 1e-4
    for r, (_, extra) in enumerate(runs):
        t, i, mx, b = extra["collectives"]
        assert t == [10.0] * 1000 and i == [10] * 10, f"rank {r}"
        assert mx == 3.0 and b == 10, f"rank {r}"
        # What went to Gloo was said, once per kind.
        said = extra["warnings"]
        assert any("broadcast goes through gloo" in w for w in said), said
        assert len(said) == len(set(said)), said


def test_hook_raises_within_give_up_when_the_switch_dies(switch):
    sw = switch(2)
    pid = sw.proc.pid
    runs = run_ranks(torch_ranks.train, _same_port_args(sw, "no-fallback", 1.0, pid), timeout=120)
    for r, (steps, extra) in enumerate(runs):
        assert steps == [], f"rank {r} trained without its switch"
        assert "Timeout" in extra["raised"], extra
        assert extra["after"] < 10, extra


def test_hook_falls_back_to_gloo_with_a_warning(switch):
    sw = switch(2)
    runs = run_ranks(torch_ranks.train, _same_port_args(sw, "fallback", 1.0, sw.proc.pid), timeout=120)
    for step in range(STEPS):
        assert np.array_equal(runs[0][0][step], runs[1][0][step])
    for r, (_, extra) in enumerate(runs):
        assert "raised" not in extra, extra
        assert any("fallback process group" in w for w in extra["warnings"]), extra["warnings"]


def _same_port_args(sw, mode: str, give_up: float, pid: int) -> list:
    port = free_tcp_port()
    return [(mode, sw.kwargs(r), port, STEPS, give_up, pid) for r in range(sw.workers)]


SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
import ina, ina.torch
sys.path.insert(0, {tests!r})
import torch_ranks
dist.init_process_group("gloo")
{bind}
comm = ina.Communicator.join()
ddp = torch.nn.parallel.DistributedDataParallel(torch_ranks.model())
ddp.register_comm_hook(ina.torch.HookState(comm), ina.torch.allreduce_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(int(os.environ["RANK"]))
for _ in range(3):
    loss = torch.nn.functional.cross_entropy(ddp(torch.randn(16, 64, generator=g)), torch.randint(0, 10, (16,), generator=g))
    opt.zero_grad(); loss.backward(); opt.step()
with open(os.path.join({out!r}, f"rank{{comm.rank}}.json"), "w") as f:
    json.dump({{"rank": comm.rank, "world": comm.world_size, "env_rank": int(os.environ["RANK"]),
               "params": torch_ranks.params(ddp.module).tolist()}}, f)
dist.destroy_process_group()
"""


def _ready(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    event = json.loads(line)
    assert event.get("event") == "ready", line
    return event


SWITCH = ["switch", "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--pool-slots", "1024"]


def _started(procs: list, binary: str, args: list) -> dict:
    """Starts `ina ARGS`, kept in `procs` to be killed, and returns its ready line."""
    p = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    procs.append(p)
    return _ready(p)


def _torchrun(tmp: str, env: dict, nproc: int, bind: str, timeout: float) -> list:
    """Runs SCRIPT (with the line `bind` before it joins) as `nproc` torchrun ranks of job
    "train"; asserts each ended well and knows its rank and the world; returns their outputs."""
    script = Path(tmp) / "train.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent), out=tmp, bind=bind))
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
         "--master-port", str(free_tcp_port()), str(script)],
        env={**env, "INA_JOB": "train"}, capture_output=True, text=True, timeout=timeout,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(nproc)]
    for r, out in enumerate(ranks):
        assert out["world"] == nproc and out["rank"] == out["env_rank"] == r, out
    return ranks


@contextmanager
def _controller_cluster():
    """The ina binary, a controller with its state in a temporary directory, the environment
    that reaches it, and a list of processes that are killed at the end; skips without ina."""
    binary = ina_binary()
    if binary is None:
        pytest.skip("no ina binary: build it (cargo build --release) or set INA_BIN")
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        try:
            env = _controller_env(procs, binary, tmp)
            yield binary, tmp, env, procs
        finally:
            for p in procs:
                p.kill()
                p.wait()


def _controller_env(procs: list, binary: str, tmp: str) -> dict:
    """Starts a controller with its state in `tmp`; the environment that reaches it."""
    c = _started(procs, binary, ["controller", "--listen", "127.0.0.1:0", "--state-dir", f"{tmp}/state"])
    return {**os.environ, "INA_CONTROLLER": c["api"], "INA_CONTROLLER_TOKEN_FILE": c["token_file"]}


def test_torchrun_finds_its_switch_through_the_controller():
    with _controller_cluster() as (binary, tmp, env, procs):
        s = _started(procs, binary, SWITCH)
        for args in (
            ["switch", "add", "tor", "--control", s["control"], "--data", s["udp"], "--slots", "1024", "--elems", "256"],
            ["job", "create", "train", "--size", "2"],
        ):
            subprocess.run([binary, *args], env=env, check=True, capture_output=True, timeout=30)
        start = time.monotonic()
        ranks = _torchrun(tmp, env, 2, bind="", timeout=180)
        assert ranks[0]["params"] == ranks[1]["params"]
        assert time.monotonic() - start < 170


def test_torchrun_across_two_racks_runs_on_the_tree_the_controller_builds():
    """Four torchrun ranks, two on each of two racks' hosts (127.0.1.1, 127.0.2.1): the
    controller builds the tree (two rack switches under an upper switch) by itself, and every
    rank trains to the same parameters, knowing its rank and a world of four."""
    with _controller_cluster() as (binary, tmp, env, procs):
        switches = [_started(procs, binary, SWITCH) for _ in range(3)]
        top, *racks = switches
        adds = [["switch", "add", "top", "--upper", "--control", top["control"], "--data", top["udp"], "--slots", "1024"]]
        for i, s in enumerate(racks, start=1):
            adds.append(
                ["switch", "add", f"tor{i}", "--control", s["control"], "--data", s["udp"], "--slots", "1024",
                 "--rack", f"r{i}", "--hosts", f"127.0.{i}.1", "--under", "top"]
            )
        for args in (*adds, ["job", "create", "train", "--size", "4"]):
            subprocess.run([binary, *args], env=env, check=True, capture_output=True, timeout=30)
        bind = 'os.environ["INA_BIND"] = f"127.0.{1 + int(os.environ[\'RANK\']) % 2}.1:0"'
        ranks = _torchrun(tmp, env, 4, bind=bind, timeout=300)
        for r, out in enumerate(ranks):
            assert out["params"] == ranks[0]["params"], f"rank {r}"
        job = json.loads(
            subprocess.run([binary, "job", "show", "train"], env=env, check=True, capture_output=True,
                           text=True, timeout=30).stdout
        )
        assert job["switch"] == "top" and [r["switch"] for r in job["racks"]] == ["tor1", "tor2"], job
