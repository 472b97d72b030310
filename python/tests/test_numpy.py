"""The NumPy API against a software switch, with every rank a process of its own."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ina
import ranks
from conftest import run_ranks


def bound(inputs: list[np.ndarray], elems: int) -> np.ndarray:
    """The quantizer's documented bound on |result - exact| per element (ina-proto's
    quant::error_bound): per block of `elems`, e from the largest magnitude over the ranks."""
    n = len(inputs)
    c = 0 if n == 1 else math.ceil(math.log2(n))
    stacked = np.abs(np.stack(inputs).astype(np.float64))
    exact = np.stack(inputs).astype(np.float64).sum(axis=0)
    out = np.empty_like(exact)
    for start in range(0, exact.size, elems):
        block = slice(start, start + elems)
        m = stacked[:, block].max()
        if m == 0:
            out[block] = 0.0
            continue
        e = math.floor(math.log2(m)) + 1
        out[block] = n * 2.0 ** (c + e - 32) * (1 + 2.0**-24) + 2.0**-24 * np.abs(exact[block]) + 2.0**-149
    return out


def test_four_ranks_sum_floats_within_the_bound_and_ints_exactly(switch):
    sw = switch(4)
    n, rounds = 300_000, 3
    results = run_ranks(ranks.sum_floats_and_ints, [(sw.kwargs(r), n, rounds) for r in range(4)])
    elems = results[0]["elems"]
    for k in range(rounds):
        inputs = [ranks.data(r, n, seed=k) for r in range(4)]
        exact = np.stack(inputs).astype(np.float64).sum(axis=0)
        first = results[0]["floats"][k]
        for r in range(1, 4):
            assert np.array_equal(results[r]["floats"][k], first), f"rank {r} differs in round {k}"
        err = np.abs(first.astype(np.float64) - exact)
        assert (err <= bound(inputs, elems)).all(), f"round {k}: max error {err.max()}"
        # Not trivially exact: the quantizer does round.
        assert err.max() > 0
        ints = [ranks.ints(r, n // 3) for r in range(4)]
        want = np.stack(ints).astype(np.int64).sum(axis=0)
        want = ((want + 2**31) % 2**32 - 2**31).astype(np.int32)
        for r in range(4):
            assert np.array_equal(results[r]["ints"][k], want), f"rank {r} int32 round {k}"


def test_several_tensors_in_flight(switch):
    sw = switch(4)
    sizes = [1, 255, 256, 70_000, 5_000, 123_457]
    results = run_ranks(ranks.several_in_flight, [(sw.kwargs(r, lanes=2), sizes) for r in range(4)])
    for i, n in enumerate(sizes):
        inputs = [ranks.data(r, n, seed=i) for r in range(4)]
        exact = np.stack(inputs).astype(np.float64).sum(axis=0)
        got = results[0][i]
        for r in range(1, 4):
            assert np.array_equal(results[r][i], got)
        assert (np.abs(got - exact) <= bound(inputs, 256)).all(), f"tensor {i} of {n}"


def test_torch_cpu_tensors_in_place(switch):
    pytest.importorskip("torch", reason="torch is not installed")
    sw = switch(2)
    n = 50_000
    results = run_ranks(ranks.torch_tensors, [(sw.kwargs(r), n) for r in range(2)])
    inputs = [ranks.data(r, n) for r in range(2)]
    exact = np.stack(inputs).astype(np.float64).sum(axis=0)
    assert (np.abs(results[0][0] - exact) <= bound(inputs, 256)).all()
    assert np.array_equal(results[0][0], results[1][0])
    want = (ranks.ints(0, n).astype(np.int64) + ranks.ints(1, n)).astype(np.int64)
    want = ((want + 2**31) % 2**32 - 2**31).astype(np.int32)
    assert np.array_equal(results[1][1], want)


def test_a_missing_rank_times_out_naming_it(switch):
    sw = switch(2)
    (out,) = run_ranks(ranks.one_rank_alone, [(sw.kwargs(0, give_up=1.0),)])
    seconds, missing, message = out.split(" ", 2)
    assert float(seconds) < 10, out
    assert missing == "[1]", out
    assert "1" in message


@pytest.mark.parametrize(
    "kind,errors",
    [("nan", {"NonFinite"}), ("types", {"Mismatch", "Rejected"}), ("lengths", {"Mismatch", "Rejected"})],
)
def test_misuse_raises_a_typed_error_on_every_rank(switch, kind, errors):
    sw = switch(2)
    results = run_ranks(ranks.expect_error, [(sw.kwargs(r, give_up=2.0), kind, 10_000) for r in range(2)])
    for r, name in enumerate(results):
        assert name in errors, f"rank {r}: {name}"


def test_bad_inputs_are_refused_before_anything_is_sent(switch):
    sw = switch(1)
    comm = ina.Communicator(**sw.kwargs(0))
    with pytest.raises(TypeError, match="float32 and int32"):
        comm.allreduce(np.ones(8, dtype=np.float64))
    with pytest.raises(ValueError, match="non-contiguous"):
        comm.allreduce(np.ones((8, 8), dtype=np.float32)[:, 1])
    ro = np.ones(8, dtype=np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        comm.allreduce(ro)
    with pytest.raises(TypeError, match="buffer protocol"):
        comm.allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match="big-endian"):
        comm.allreduce(np.ones(8, dtype=">f4"))
    # A one-rank job: the sum is the tensor itself; an empty tensor is a no-op.
    x = np.arange(1000, dtype=np.float32)
    comm.allreduce(x)
    assert np.array_equal(x, np.arange(1000, dtype=np.float32))
    assert comm.allreduce(np.zeros(0, dtype=np.float32)) is None
    comm.close()
    with pytest.raises(ina.Error, match="closed"):
        comm.allreduce(x)


def test_wrong_configuration_is_a_config_error(switch):
    sw = switch(2)
    with pytest.raises(ValueError, match="below the world size"):
        ina.Communicator(**{**sw.kwargs(0), "rank": 2})
    with pytest.raises(ina.ConfigError):
        ina.Communicator(**{**sw.kwargs(0), "world_size": 3})
    with pytest.raises(ina.ConfigError):
        ina.Communicator(**{**sw.kwargs(0), "switch": "no-such-host.invalid:1"})
    with pytest.raises(ValueError, match="give_up"):
        ina.Communicator(**sw.kwargs(0, give_up=-1))


def test_an_unreachable_switch_fails_within_the_probe_timeout(switch):
    sw = switch(1)
    sw.stop()
    import time

    start = time.monotonic()
    with pytest.raises(ina.Timeout):
        ina.Communicator(**sw.kwargs(0, probe_timeout=0.5))
    assert time.monotonic() - start < 5


def test_waiting_releases_the_gil(switch):
    """Two ranks in one process: rank 1 starts from another Python thread while rank 0 blocks
    in allreduce; that can finish only if the wait released the GIL."""
    import threading
    import time

    sw = switch(2)
    c0 = ina.Communicator(**sw.kwargs(0))
    c1 = ina.Communicator(**sw.kwargs(1))
    x0 = np.full(200_000, 1.0, dtype=np.float32)
    x1 = np.full(200_000, 2.0, dtype=np.float32)
    ticks = []

    def rank1():
        time.sleep(0.3)
        ticks.append(time.monotonic())
        c1.allreduce(x1)

    t = threading.Thread(target=rank1)
    t.start()
    start = time.monotonic()
    c0.allreduce(x0)
    t.join()
    assert ticks and ticks[0] - start >= 0.25
    assert np.array_equal(x0, np.full(200_000, 3.0, dtype=np.float32))
    assert np.array_equal(x1, x0)


def test_a_restarted_switch_raises_switch_restarted(switch):
    sw = switch(1)
    comm = ina.Communicator(**sw.kwargs(0))
    x = np.ones(10_000, dtype=np.float32)
    comm.allreduce(x)
    # The same switch address and job, started again: a new epoch.
    sw.stop()
    import subprocess
    import time

    from conftest import ina_binary

    spec = f"id={sw.job};slots=0..256;elems=256;workers=" + ",".join(sw.ranks)
    sw.proc = subprocess.Popen(
        [ina_binary(), "switch", "--listen", sw.addr, "--job", spec],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    with pytest.raises(ina.SwitchRestarted):
        comm.allreduce(x)


def test_sparse_mode_sums_an_embedding_gradient_exactly_as_dense(switch):
    sw = switch(4)
    results = run_ranks(ranks.sparse_embedding, [(sw.kwargs(r), 2000, 64) for r in range(4)])
    first_sparse = results[0]["sparse"][0][0]
    for r, res in enumerate(results):
        sparse, went_sparse, own, union = res["sparse"][0]
        dense, went_dense, _, _ = res["dense"][0]
        # Bit for bit the dense result, and the same on every rank.
        assert np.array_equal(sparse.view(np.int32), dense.view(np.int32)), f"rank {r}"
        assert np.array_equal(sparse.view(np.int32), first_sparse.view(np.int32)), f"rank {r}"
        assert went_sparse and not went_dense
        assert 0 < own <= union < 0.25, (own, union)
        # Auto goes sparse while the union measured is small.
        assert [a[1] for a in res["auto"]] == [True, True]
