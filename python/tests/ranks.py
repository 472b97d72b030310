"""What each rank process of the tests runs (importable by spawned processes)."""

from __future__ import annotations

import time

import numpy as np

import ina


def data(rank: int, n: int, seed: int = 0) -> np.ndarray:
    """Rank `rank`'s float32 tensor: magnitudes that vary by block, some zero blocks."""
    rng = np.random.default_rng(1000 * seed + rank)
    x = rng.standard_normal(n).astype(np.float32)
    scale = np.repeat(rng.uniform(-6, 6, size=(n + 255) // 256), 256)[:n]
    x *= (2.0**scale).astype(np.float32)
    x[: min(n, 512)] = 0.0
    return x


def ints(rank: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(77 + rank)
    return rng.integers(-(2**31), 2**31, size=n, dtype=np.int64).astype(np.int32)


def sum_floats_and_ints(kwargs: dict, n: int, rounds: int) -> dict:
    comm = ina.Communicator(**kwargs)
    out = {"floats": [], "ints": [], "elems": comm.elems_per_packet}
    for r in range(rounds):
        x = data(comm.rank, n, seed=r)
        stats = comm.allreduce(x)
        assert isinstance(stats, ina.Stats) and stats.seconds > 0
        out["floats"].append(x)
        y = ints(comm.rank, n // 3)
        comm.allreduce(y)
        out["ints"].append(y)
    comm.close()
    return out


def several_in_flight(kwargs: dict, sizes: list[int]) -> list[np.ndarray]:
    comm = ina.Communicator(**kwargs)
    tensors = [data(comm.rank, n, seed=i) for i, n in enumerate(sizes)]
    handles = [comm.allreduce_async(t) for t in tensors]
    # done() turns true by itself, without wait().
    deadline = time.monotonic() + 60
    while not all(h.done() for h in handles):
        assert time.monotonic() < deadline, "handles never done"
        time.sleep(0.005)
    for h in handles:
        h.wait()
    comm.close()
    return tensors


def torch_tensors(kwargs: dict, n: int) -> list:
    import torch

    comm = ina.Communicator(**kwargs)
    x = torch.from_numpy(data(comm.rank, n))
    ptr = x.data_ptr()
    comm.allreduce(x)
    assert x.data_ptr() == ptr
    y = torch.from_numpy(ints(comm.rank, n))
    comm.allreduce(y)
    comm.close()
    return [x.numpy(), y.numpy()]


def one_rank_alone(kwargs: dict) -> str:
    """Rank 0 of a two-rank job whose rank 1 never comes."""
    comm = ina.Communicator(**kwargs)
    x = np.ones(10_000, dtype=np.float32)
    start = time.monotonic()
    try:
        comm.allreduce(x)
    except ina.Timeout as e:
        return f"{time.monotonic() - start:.2f} {e.missing_ranks} {e}"
    raise AssertionError("no timeout")


def expect_error(kwargs: dict, kind: str, n: int) -> str:
    """Each rank all-reduces a tensor of its own making (`kind`); returns the error's class."""
    comm = ina.Communicator(**kwargs)
    rank = comm.rank
    if kind == "nan":
        x = np.ones(n, dtype=np.float32)
        if rank == 1:
            x[n // 2] = np.nan
    elif kind == "types":
        x = np.ones(n, dtype=np.float32) if rank == 0 else np.ones(n, dtype=np.int32)
    elif kind == "lengths":
        x = np.ones(n * (rank + 1), dtype=np.float32)
    else:
        raise ValueError(kind)
    try:
        comm.allreduce(x)
    except ina.Error as e:
        return type(e).__name__
    return "no error"


def sparse_embedding(kwargs: dict, rows: int, width: int) -> dict:
    """An embedding's gradient: this rank touched a few rows of its own and row 0. The same
    tensor is summed sparse, dense and with auto twice; returns the results and the stats."""
    rank = kwargs["rank"]
    grad = np.zeros((rows, width), dtype=np.float32)
    rng = np.random.default_rng(rank)
    touched = [0] + list(rng.choice(rows, size=rows // 100, replace=False))
    for row in touched:
        grad[row] = rng.standard_normal(width).astype(np.float32)
    out = {}
    with ina.Communicator(**kwargs) as comm:
        for mode in ["sparse", "dense", "auto", "auto"]:
            x = grad.copy()
            stats = comm.allreduce(x, mode=mode)
            out.setdefault(mode, []).append(
                (x, stats.sparse, stats.own_density, stats.union_density)
            )
    return out
