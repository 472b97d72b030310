"""PyTorch on ina: a DDP communication hook and a ``torch.distributed`` backend.

The hook, two lines on a DDP model::

    state = ina.torch.HookState(ina.Communicator.join())
    ddp.register_comm_hook(state, ina.torch.allreduce_hook)

Each gradient bucket goes through the switch as DDP finishes it, overlapping the rest of the
backward pass, and comes back averaged over the ranks, as DDP expects.

The backend::

    import ina.torch  # registers "ina"
    torch.distributed.init_process_group("cpu:ina")

makes ``all_reduce`` of float32 and int32 sums of CPU tensors go through the switch and hands
every other collective (broadcast, barrier, other operations and element types) to a Gloo
group it keeps beside, saying so once per kind.

Both find their switch from the environment ``torchrun`` leaves them (``RANK``,
``WORLD_SIZE``) and ``INA_CONTROLLER`` with ``INA_JOB`` (see :meth:`ina.Communicator.join`),
or without a controller ``INA_SWITCH``, ``INA_BIND`` and ``INA_JOB_ID``.
"""

import os
import queue
import threading
import warnings
from datetime import timedelta
from typing import Any, Callable, Optional

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"ina.torch needs PyTorch (pip install torch): {e}") from e

import ina

__all__ = ["HookState", "allreduce_hook", "communicator_from_env", "ProcessGroupIna"]


def communicator_from_env(rank: Optional[int] = None, world_size: Optional[int] = None, **kw: Any) -> ina.Communicator:
    """The communicator the environment describes: joined through ``INA_CONTROLLER`` and
    ``INA_JOB`` if set, else on the switch ``INA_SWITCH`` as job ``INA_JOB_ID`` (default 1)
    from ``INA_BIND``, with ``rank`` and ``world_size`` (default: ``RANK`` and
    ``WORLD_SIZE``)."""
    if rank is None and os.environ.get("RANK"):
        rank = int(os.environ["RANK"])
    if os.environ.get("INA_CONTROLLER"):
        return ina.Communicator.join(rank=rank, **kw)
    switch = os.environ.get("INA_SWITCH")
    bind = os.environ.get("INA_BIND")
    if world_size is None and os.environ.get("WORLD_SIZE"):
        world_size = int(os.environ["WORLD_SIZE"])
    if not switch or not bind or rank is None or world_size is None:
        raise ina.ConfigError(
            "no ina switch configured: set INA_CONTROLLER and INA_JOB (a job the controller "
            "runs), or INA_SWITCH, INA_BIND and INA_JOB_ID with RANK and WORLD_SIZE"
        )
    job = int(os.environ.get("INA_JOB_ID", "1"))
    return ina.Communicator(switch, bind, rank, world_size, job, **kw)


class _Completer:
    """Finishes futures in submission order as their all-reduces end, on one thread."""

    def __init__(self) -> None:
        self._queue: "queue.Queue[tuple[Optional[ina.Handle], Callable[[], None], Callable[[BaseException], None]]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="ina-completer", daemon=True)
        self._thread.start()

    def add(
        self,
        handle: Optional[ina.Handle],
        ok: Callable[[Optional[ina.Stats]], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        """Runs `ok` with the all-reduce's stats once `handle` ended well (at once, with None,
        for None), else `failed`, after everything added before."""
        self._queue.put((handle, ok, failed))

    def _run(self) -> None:
        while True:
            handle, ok, failed = self._queue.get()
            try:
                stats = handle.wait() if handle is not None else None
            except BaseException as e:  # noqa: BLE001 - handed to the future
                failed(e)
                continue
            try:
                ok(stats)
            except BaseException as e:  # noqa: BLE001
                failed(e)


def _sum_tensor(tensor: torch.Tensor, staging: dict, slot: Any) -> tuple[torch.Tensor, Callable[[], None]]:
    """The host float32/int32 contiguous tensor ina sums for `tensor`, and what copies the sum
    back into `tensor` (nothing when it is that tensor). A staging buffer (pinned host memory
    for a CUDA tensor) is kept per `slot` (a bucket: several can be in flight at once)."""
    if tensor.device.type == "cpu" and tensor.dtype in (torch.float32, torch.int32) and tensor.is_contiguous():
        return tensor, lambda: None
    dtype = torch.int32 if tensor.dtype == torch.int32 else torch.float32
    key = (slot, tensor.numel(), dtype)
    host = staging.get(key)
    if host is None:
        pin = tensor.device.type == "cuda"
        host = torch.empty(tensor.numel(), dtype=dtype, pin_memory=pin)
        staging[key] = host
    host.copy_(tensor.reshape(-1))

    def back() -> None:
        tensor.copy_(host.view(tensor.shape), non_blocking=tensor.device.type == "cuda")

    return host, back


class HookState:
    """What :func:`allreduce_hook` needs: the communicator and, optionally, a process group to
    fall back on.

    Args:
        communicator: this rank's :class:`ina.Communicator`.
        fallback: a process group (for example ``dist.new_group(backend="gloo")``) that takes
            over, with a warning, if an all-reduce through ina fails; None raises instead.
            With a fallback each bucket is copied before it is sent, so that the failed one
            can be sent again.
        mode: how buckets travel (see :meth:`ina.Communicator.allreduce_async`). The default,
            ``"auto"``, sends a bucket sparse while the union of the ranks' non-zero blocks
            of its previous all-reduce was below 90% of its blocks (an embedding's gradient),
            dense otherwise; every rank decides alike from the same results.
    """

    def __init__(
        self, communicator: ina.Communicator, fallback: Optional[Any] = None, mode: str = "auto"
    ) -> None:
        self.communicator = communicator
        self.fallback = fallback
        self.mode = mode
        self.failed: Optional[BaseException] = None
        #: Buckets all-reduced sparse and dense so far.
        self.buckets_sparse = 0
        self.buckets_dense = 0
        self._completer = _Completer()
        self._staging: dict = {}

    def __getstate__(self):  # DDP may copy hook states; the communicator cannot be copied
        raise TypeError("ina.torch.HookState cannot be pickled")


def _fall_back(state: HookState, tensor: torch.Tensor, error: BaseException, fut: torch.futures.Future) -> None:
    if state.failed is None:
        state.failed = error
        warnings.warn(
            f"ina all-reduce failed ({error}); gradients go through the fallback process group from now on",
            RuntimeWarning,
            stacklevel=2,
        )
    work = dist.all_reduce(tensor, group=state.fallback, async_op=True)
    world = state.communicator.world_size

    def done(_: Any) -> torch.Tensor:
        tensor.div_(world)
        fut.set_result(tensor)
        return tensor

    work.get_future().then(done)


def allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: sums the bucket through ina and divides it by the world size.

    Register with ``ddp.register_comm_hook(HookState(comm), allreduce_hook)``. A failed
    all-reduce sets the future's exception (DDP raises it from ``backward``), or with a
    fallback group sends the bucket through that group, warning once.
    """
    tensor = bucket.buffer()
    fut, result = _future()
    world = state.communicator.world_size
    if state.failed is not None and state.fallback is not None:
        # In order with the buckets before it, which may still be falling back: every rank
        # must issue the fallback group's collectives in the same order.
        error = state.failed
        state._completer.add(None, lambda _: _fall_back(state, tensor, error, fut), fut.set_exception)
        return result
    original = tensor.clone() if state.fallback is not None else None
    host, back = _sum_tensor(tensor, state._staging, bucket.index())

    def ok(stats: Optional[ina.Stats]) -> None:
        if stats is not None and stats.sparse:
            state.buckets_sparse += 1
        else:
            state.buckets_dense += 1
        back()
        tensor.div_(world)
        fut.set_result(tensor)

    def failed(e: BaseException) -> None:
        if state.fallback is not None and original is not None:
            tensor.copy_(original)
            _fall_back(state, tensor, e, fut)
        else:
            fut.set_exception(e)

    try:
        handle = state.communicator.allreduce_async(host, state.mode)
    except ina.Error as e:
        failed(e)
        return result
    state._completer.add(handle, ok, failed)
    return result


def _future() -> tuple:
    """A future to complete, and the future to hand to torch: chained, so that an exception
    set on the first fails the second as torch's C++ side sees it (DDP raises it from
    backward) rather than as a value it cannot read."""
    fut: torch.futures.Future = torch.futures.Future()
    return fut, fut.then(lambda f: f.value())


# ---- The torch.distributed backend ----

_warned: set = set()


def _delegated(what: str) -> None:
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"ina backend: {what} goes through gloo (ina sums float32 and int32 only)", stacklevel=3)


# The collectives ProcessGroupIna hands to Gloo as they are.
_DELEGATED = frozenset(
    {
        "allgather_coalesced",
        "allgather_into_tensor_coalesced",
        "_allgather_base",
        "allreduce_coalesced",
        "alltoall",
        "alltoall_base",
        "gather",
        "scatter",
        "reduce",
        "reduce_scatter",
        "_reduce_scatter_base",
        "reduce_scatter_tensor_coalesced",
        "send",
        "recv",
        "recv_anysource",
        "monitoredBarrier",
    }
)


class ProcessGroupIna(dist.ProcessGroup):
    """A process group whose sums of float32 and int32 CPU tensors go through ina; every other
    collective goes to the Gloo group it keeps (created on the same store)."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout: timedelta) -> None:
        super().__init__(rank, world_size)
        self._rank = rank
        self._world = world_size
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world_size, timeout)
        self._comm = communicator_from_env(rank=rank, world_size=world_size)
        if self._comm.world_size != world_size or self._comm.rank != rank:
            raise ina.ConfigError(
                f"the ina job has rank {self._comm.rank} of {self._comm.world_size}, the process "
                f"group rank {rank} of {world_size}"
            )
        self._completer = _Completer()

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "ina"

    def size(self) -> int:
        return self._world

    def allreduce(self, tensor_list, opts=None):
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        ours = (
            op == dist.ReduceOp.SUM
            and all(
                t.device.type == "cpu" and t.dtype in (torch.float32, torch.int32) and t.is_contiguous()
                for t in tensor_list
            )
        )
        if not ours:
            name = str(getattr(op, "op", op)).rsplit(".", 1)[-1].lower()
            dtypes = ", ".join(sorted({str(t.dtype).replace("torch.", "") for t in tensor_list}))
            _delegated(f"all_reduce ({name}, {dtypes})")
            return self._gloo.allreduce(tensor_list, opts) if opts is not None else self._gloo.allreduce(tensor_list)
        fut, result = _future()
        handles = [self._comm.allreduce_async(t) for t in tensor_list]
        for i, h in enumerate(handles):
            last = i == len(handles) - 1
            self._completer.add(
                h,
                (lambda _: fut.set_result(tensor_list)) if last else (lambda _: None),
                lambda e: None if fut.done() else fut.set_exception(e),
            )
        return torch._C._distributed_c10d._create_work_from_future(result)

    def __getattr__(self, name: str):
        # Every other collective: Gloo's. (Other attributes are the base class's: the
        # binding looks its virtual methods up here first.)
        if name not in _DELEGATED:
            raise AttributeError(name)
        _delegated(name)
        return getattr(self._gloo, name)

    def broadcast(self, tensor_list, opts=None):
        _delegated("broadcast")
        return self._gloo.broadcast(tensor_list, opts) if opts is not None else self._gloo.broadcast(tensor_list)

    def barrier(self, opts=None):
        _delegated("barrier")
        return self._gloo.barrier(opts) if opts is not None else self._gloo.barrier()

    def allgather(self, output_tensors, input_tensor, opts=None):
        _delegated("all_gather")
        return self._gloo.allgather(output_tensors, input_tensor, opts) if opts is not None else self._gloo.allgather(output_tensors, input_tensor)


def _create(store, rank, world_size, timeout):
    return ProcessGroupIna(store, rank, world_size, timeout)


dist.Backend.register_backend("ina", _create, devices=["cpu"])
