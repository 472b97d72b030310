"""Type stubs of the native module (ina._native); use it through ``ina``."""

from typing import Optional

class Error(RuntimeError): ...

class Timeout(Error):
    missing_ranks: Optional[list[int]]

class SwitchRestarted(Error): ...
class Rejected(Error): ...
class NonFinite(Error): ...
class Mismatch(Error): ...
class ConfigError(Error): ...

class Stats:
    seconds: float
    packets_sent: int
    retransmissions: int
    sparse: bool
    own_density: float
    union_density: float

class Handle:
    def wait(self) -> Stats: ...
    def done(self) -> bool: ...

class NativeCommunicator:
    rank: int
    world_size: int
    job: int
    switch: str
    local_addr: str
    elems_per_packet: int
    def __init__(
        self,
        switch: str,
        bind: str,
        rank: int,
        world_size: int,
        job: int,
        lanes: int = 1,
        give_up: float = 5.0,
        probe_timeout: float = 5.0,
        total_workers: Optional[int] = None,
    ) -> None: ...
    @staticmethod
    def join(
        controller: str,
        job_name: str,
        bind: str,
        rank: Optional[int] = None,
        token: Optional[str] = None,
        timeout: float = 60.0,
        lanes: int = 1,
        give_up: float = 5.0,
        probe_timeout: float = 5.0,
    ) -> NativeCommunicator: ...
    def _submit(self, addr: int, len: int, dtype: str, mode: str = "dense") -> Handle: ...
    def close(self) -> None: ...
