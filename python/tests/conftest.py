"""Fixtures: a software switch (the `ina` binary) with a job on loopback, and ranks run as
separate processes."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def ina_binary() -> str | None:
    """The `ina` binary: $INA_BIN, else the repository's build, else the PATH's."""
    env = os.environ.get("INA_BIN")
    if env:
        return env
    for profile in ("release", "debug"):
        p = ROOT / "target" / profile / "ina"
        if p.exists():
            return str(p)
    return shutil.which("ina")


def free_udp_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Switch:
    """A software switch serving one job of `workers` ranks on 127.0.0.1."""

    def __init__(self, binary: str, workers: int, elems: int = 256, slots: int = 256, job: int = 1):
        ports = free_udp_ports(workers + 1)
        self.addr = f"127.0.0.1:{ports[0]}"
        self.ranks = [f"127.0.0.1:{p}" for p in ports[1:]]
        self.job = job
        self.workers = workers
        spec = f"id={job};slots=0..{slots};elems={elems};workers=" + ",".join(self.ranks)
        self.proc = subprocess.Popen(
            [binary, "switch", "--listen", self.addr, "--job", spec],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        # The switch is up once its UDP port is taken.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ina switch exited: {self.proc.stderr.read().decode()}")
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    s.bind(("127.0.0.1", ports[0]))
                except OSError:
                    return
            time.sleep(0.02)
        raise RuntimeError("ina switch did not bind its port")

    def kwargs(self, rank: int, **extra) -> dict:
        """Communicator arguments of `rank`."""
        return dict(
            switch=self.addr,
            bind=self.ranks[rank],
            rank=rank,
            world_size=self.workers,
            job=self.job,
            **extra,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def switch():
    """A factory: switch(workers, elems=256) starts a software switch with one job."""
    binary = ina_binary()
    if binary is None:
        pytest.skip("no ina binary: build it (cargo build --release) or set INA_BIN")
    started = []

    def make(workers: int, **kw) -> Switch:
        s = Switch(binary, workers, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def run_ranks(target, args_per_rank: list[tuple], timeout: float = 120.0) -> list:
    """Runs target(*args) in one process per rank; returns their results in rank order and
    raises if any rank failed or hung."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_rank_main, args=(queue, i, target, args))
        for i, args in enumerate(args_per_rank)
    ]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < len(procs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"ranks hung: {len(results) + len(errors)} of {len(procs)} ended")
            try:
                i, ok, value = queue.get(timeout=min(left, 1.0))
            except Exception:
                dead = [i for i, p in enumerate(procs) if not p.is_alive() and i not in results and i not in errors]
                if dead and all(procs[i].exitcode != 0 for i in dead):
                    time.sleep(0.2)
                    if queue.empty():
                        raise AssertionError(f"ranks {dead} died without an answer")
                continue
            (results if ok else errors)[i] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("ranks failed:\n" + "\n".join(f"rank {i}: {e}" for i, e in sorted(errors.items())))
    return [results[i] for i in range(len(procs))]


def _rank_main(queue, index, target, args):
    import traceback

    try:
        queue.put((index, True, target(*args)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        queue.put((index, False, traceback.format_exc()))
