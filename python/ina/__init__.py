"""ina: all-reduce through an in-network aggregation switch, from NumPy and PyTorch.

Each process of a training job is one rank of an ina job. A :class:`Communicator` sends its
float32 (quantized to int32 on the way) or int32 tensors to the switch, which adds every
rank's packets and sends each sum back to all ranks::

    import ina, numpy as np
    comm = ina.Communicator(switch="198.18.0.1:18800", bind="198.18.0.2:0",
                            rank=0, world_size=4, job=1)
    grad = np.ones(1 << 20, dtype=np.float32)
    comm.allreduce(grad)          # in place: grad is now the sum over the 4 ranks

or, with a controller handing out the switch and the rank::

    comm = ina.Communicator.join(controller="198.18.0.1:7070", job_name="train")

``ina.torch`` has the DDP communication hook and the ``torch.distributed`` backend.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
from typing import Any, Optional

from ._native import (
    ConfigError,
    Error,
    Handle as _NativeHandle,
    Mismatch,
    NativeCommunicator as _Native,
    NonFinite,
    Rejected,
    Stats,
    SwitchRestarted,
    Timeout,
)

__all__ = [
    "Communicator",
    "Handle",
    "Stats",
    "Error",
    "Timeout",
    "SwitchRestarted",
    "Rejected",
    "NonFinite",
    "Mismatch",
    "ConfigError",
]

#: Set on a Timeout when the switch said which ranks' data it lacked (else None).
Timeout.missing_ranks = None

# Element types by their struct format character, for 4-byte items.
_FORMATS = {"f": "float32", "i": "int32", "l": "int32"}


def _torch_tensor(x: Any):
    """`x` if it is a torch tensor (without importing torch when the caller did not)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch, x
    return None, None


def _memory(x: Any):
    """(address, element count, element type, objects to keep alive) of `x`'s memory.

    `x` is a NumPy array, a CPU torch tensor or any object with the buffer protocol, of
    float32 or int32, C-contiguous and writable.
    """
    torch, t = _torch_tensor(x)
    if t is not None:
        if t.device.type != "cpu":
            raise TypeError(
                f"a {t.device.type} tensor: Communicator.allreduce sums host memory; stage it "
                "into a CPU tensor (ina.torch's hook does so through pinned memory)"
            )
        if t.dtype not in (torch.float32, torch.int32):
            raise TypeError(f"dtype {t.dtype}: ina sums float32 and int32 tensors")
        if not t.is_contiguous():
            raise ValueError(
                "a non-contiguous tensor: ina sums contiguous memory in place; pass "
                "t.contiguous() and copy the result back"
            )
        x = t.detach().numpy()
    try:
        view = memoryview(x)
    except TypeError:
        raise TypeError(
            f"{type(x).__name__} does not expose its memory (the buffer protocol): pass a "
            "NumPy array or a CPU torch tensor"
        ) from None
    fmt = view.format
    if fmt[:1] in (">", "!"):
        raise ValueError(f"big-endian elements ({fmt!r}): ina sums native-endian ones")
    dtype = _FORMATS.get(fmt.lstrip("@=<"))
    if dtype is None or view.itemsize != 4:
        raise TypeError(
            f"element type {fmt!r} ({view.itemsize} bytes): ina sums float32 and int32"
        )
    if view.readonly:
        raise ValueError("read-only memory: ina sums in place")
    if not view.c_contiguous:
        raise ValueError(
            "non-contiguous memory: ina sums contiguous memory in place; pass a contiguous "
            "copy (numpy.ascontiguousarray) and copy the result back"
        )
    count = view.nbytes // 4
    if count == 0:
        return 0, 0, dtype, None
    raw = (ctypes.c_char * view.nbytes).from_buffer(view.cast("B"))
    return ctypes.addressof(raw), count, dtype, (raw, view, x)


class Handle:
    """One all-reduce in flight, from :meth:`Communicator.allreduce_async`."""

    __slots__ = ("_native", "_keep", "_stats")

    def __init__(self, native: Optional[_NativeHandle], keep: Any) -> None:
        self._native = native
        self._keep = keep
        self._stats: Optional[Stats] = None

    def wait(self) -> Optional[Stats]:
        """Blocks until the all-reduce ended (without holding the GIL); returns its
        statistics, or raises the error it ended with."""
        if self._native is None:
            return self._stats
        try:
            self._stats = self._native.wait()
        finally:
            # The tensor's memory is no longer used by the communicator either way.
            self._native = None
            self._keep = None
        return self._stats

    def done(self) -> bool:
        """Whether the all-reduce has ended: then :meth:`wait` returns at once."""
        return self._native is None or self._native.done()


def _route_address(host_port: str) -> str:
    """This host's address on the way to `host_port` (no packet is sent)."""
    host, _, port = host_port.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host.strip("[]"), int(port)))
        return s.getsockname()[0]


def _env_int(name: str) -> Optional[int]:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"{name}={v!r}: not an integer") from None


class Communicator:
    """One rank of an ina job: all-reduces tensors in place through the switch.

    Every rank of a job must submit the same tensors (element type and length) in the same
    order. Several may be in flight at once (:meth:`allreduce_async`); up to ``lanes`` run
    side by side, the rest queue in submission order.

    Args:
        switch: the switch's UDP address, ``"HOST:PORT"``.
        bind: this rank's local address, ``"IP:PORT"`` (the address the switch lists for the
            rank; port 0 only if the switch knows it so).
        rank: this rank, ``0 <= rank < world_size``.
        world_size: the job's number of ranks.
        job: the job's number on the switch.
        lanes: tensors the switch's window is split between (the same on every rank).
        give_up: seconds a packet may stay unanswered before :class:`Timeout`.
        probe_timeout: seconds to wait for the switch to describe the job.
        total_workers: the whole tree's number of workers when the switch is a rack switch of
            an aggregation tree.
    """

    def __init__(
        self,
        switch: str,
        bind: str,
        rank: int,
        world_size: int,
        job: int,
        *,
        lanes: int = 1,
        give_up: float = 5.0,
        probe_timeout: float = 5.0,
        total_workers: Optional[int] = None,
    ) -> None:
        self._native = _Native(
            switch,
            bind,
            rank,
            world_size,
            job,
            lanes=lanes,
            give_up=give_up,
            probe_timeout=probe_timeout,
            total_workers=total_workers,
        )

    @classmethod
    def join(
        cls,
        controller: Optional[str] = None,
        job_name: Optional[str] = None,
        *,
        bind: Optional[str] = None,
        rank: Optional[int] = None,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        timeout: float = 60.0,
        lanes: int = 1,
        give_up: float = 5.0,
        probe_timeout: float = 5.0,
    ) -> "Communicator":
        """Joins job ``job_name`` through the controller, which gives the switch, the job's
        number, the rank and the world size; returns once every rank joined and the job is
        installed.

        Unset arguments come from the environment: ``controller`` from ``INA_CONTROLLER``,
        ``job_name`` from ``INA_JOB``, ``rank`` from ``RANK`` (as ``torchrun`` sets it; else
        the controller picks), ``bind`` from ``INA_BIND`` (else this host's address towards
        the controller, any port), ``token`` from ``INA_CONTROLLER_TOKEN`` or the file ``token_file`` /
        ``INA_CONTROLLER_TOKEN_FILE``.
        """
        controller = controller or os.environ.get("INA_CONTROLLER")
        job_name = job_name or os.environ.get("INA_JOB")
        if not controller or not job_name:
            raise ConfigError(
                "Communicator.join needs the controller and the job's name: pass controller= "
                "and job_name=, or set INA_CONTROLLER and INA_JOB"
            )
        if rank is None:
            rank = _env_int("RANK")
        if bind is None:
            bind = os.environ.get("INA_BIND") or f"{_route_address(controller)}:0"
        if token is None:
            token = os.environ.get("INA_CONTROLLER_TOKEN") or None
        token_file = token_file or os.environ.get("INA_CONTROLLER_TOKEN_FILE")
        if token is None and token_file:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        self = cls.__new__(cls)
        self._native = _Native.join(
            controller,
            job_name,
            bind,
            rank=rank,
            token=token,
            timeout=timeout,
            lanes=lanes,
            give_up=give_up,
            probe_timeout=probe_timeout,
        )
        return self

    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def world_size(self) -> int:
        return self._native.world_size

    @property
    def job(self) -> int:
        """The job's number on the switch."""
        return self._native.job

    @property
    def switch(self) -> str:
        """The switch's UDP address."""
        return self._native.switch

    @property
    def local_addr(self) -> str:
        """This rank's UDP address."""
        return self._native.local_addr

    @property
    def elems_per_packet(self) -> int:
        return self._native.elems_per_packet

    def allreduce_async(self, x: Any, mode: str = "dense") -> Handle:
        """Starts summing ``x`` over all ranks, in place, and returns at once.

        ``x``: a NumPy array, a CPU torch tensor or another object with the buffer protocol,
        of float32 or int32, C-contiguous and writable. Do not touch it until the returned
        handle's :meth:`Handle.wait` has returned.

        ``mode``: ``"dense"`` sends every block; ``"sparse"`` sends only the blocks some rank
        holds (a block of zeros is held by none); ``"auto"`` picks one from the density the
        previous all-reduce of the same shape measured. Every rank must pass the same mode for
        the same tensor. A tensor that is not dense runs after the ones submitted before it.
        """
        addr, count, dtype, keep = _memory(x)
        if count == 0:
            return Handle(None, None)
        return Handle(self._native._submit(addr, count, dtype, mode), keep)

    def allreduce(self, x: Any, mode: str = "dense") -> Optional[Stats]:
        """Sums ``x`` over all ranks, in place; returns the all-reduce's statistics
        (``mode``: see :meth:`allreduce_async`)."""
        return self.allreduce_async(x, mode).wait()

    def close(self) -> None:
        """Stops the communicator; later all-reduces raise :class:`Error`."""
        self._native.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ina.Communicator(rank={self.rank}, world_size={self.world_size}, "
            f"job={self.job}, switch={self.switch!r})"
        )
