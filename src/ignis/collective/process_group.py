"""Process groups: ``init_process_group()`` from the launcher's environment.

Rules:
- The group comes from arguments, else ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (as ``torchrun`` and
  ``ignis launch`` set them), else, under MPI with ``mpi4py`` and no
  ``RANK``, from MPI itself. With none of these it is a group of one.
- Each rank works on the Ignis device ``LOCAL_RANK`` (one process per GPU).
- ``backend``: ``"nccl"`` on the cuda backend, ``"emulated"`` (loopback TCP
  between processes, see ``loopback``) on the emulated one; ``None`` picks
  the one that fits. Asking for the other one raises ``UnsupportedError``.
  Which fits is a capability of the Ignis backend: NCCL needs the CUDA driver
  (``Backend.cuda_driver``), the loopback transport moves bytes through host
  views of device memory (``Backend.host_memory``).
- The first group made is the default one (``get_communicator()``); it is
  closed at interpreter exit if the program did not close it.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

from ..backends import get_backend
from ..errors import UnsupportedError
from ..runtime import Device
from .communicator import Communicator, Health
from .errors import CollectiveError
from .loopback import LoopbackEngine
from .rendezvous import MpiRendezvous, Rendezvous

__all__ = ["init_process_group", "get_communicator", "destroy_process_group", "is_initialized", "GroupEnv",
           "read_env", "DEFAULT_TIMEOUT", "BACKENDS"]

DEFAULT_TIMEOUT = 300.0
DEFAULT_PORT = 29500
BACKENDS = ("nccl", "emulated")
_MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_MPI_LOCAL_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")

_default: Communicator | None = None
_atexit_registered = False


@dataclass(frozen=True, slots=True)
class GroupEnv:
    """Where this process sits in its group, and how to reach rank 0."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # "env", "args", "mpi" or "single"


def _int_env(name: str, env: dict[str, str]) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer") from None


def read_env(rank: int | None = None, world_size: int | None = None, local_rank: int | None = None,
             master_addr: str | None = None, master_port: int | None = None,
             env: dict[str, str] | None = None) -> GroupEnv:
    """Resolve the group from arguments and the environment (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    source = "args" if rank is not None or world_size is not None else "env"
    rank = _int_env("RANK", env) if rank is None else rank
    world_size = _int_env("WORLD_SIZE", env) if world_size is None else world_size
    if rank is None and world_size is None:
        source = "single"
        rank, world_size = 0, 1
    elif rank is None or world_size is None:
        missing = "RANK" if rank is None else "WORLD_SIZE"
        raise ValueError(f"{missing} is not set, but {'WORLD_SIZE' if rank is None else 'RANK'} is; set both "
                         "(ignis launch and torchrun do), or neither for a group of one")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} is not valid for WORLD_SIZE={world_size} (need 0 <= RANK < WORLD_SIZE)")
    if local_rank is None:
        local_rank = _int_env("LOCAL_RANK", env)
    if local_rank is None:
        local_rank = rank
    if local_rank < 0:
        raise ValueError(f"LOCAL_RANK={local_rank} must be >= 0")
    addr = master_addr or env.get("MASTER_ADDR", "").strip() or "127.0.0.1"
    port = master_port if master_port is not None else (_int_env("MASTER_PORT", env) or DEFAULT_PORT)
    if not 0 < port < 65536:
        raise ValueError(f"MASTER_PORT={port} is not a TCP port")
    return GroupEnv(rank, world_size, local_rank, addr, port, source)


def _mpi_env() -> tuple[GroupEnv, Any] | None:
    """The group from MPI, when launched by mpirun/srun without RANK and mpi4py is present."""
    if "RANK" in os.environ or not any(v in os.environ for v in _MPI_RANK_VARS):
        return None
    try:
        from mpi4py import MPI  # type: ignore[import-not-found]
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    local = next((int(os.environ[v]) for v in _MPI_LOCAL_VARS if os.environ.get(v, "").isdigit()), None)
    if local is None:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    return GroupEnv(comm.Get_rank(), comm.Get_size(), local, "", 0, "mpi"), comm


def _pick_backend(backend: str | None) -> str:
    ig = get_backend()
    if backend is None:
        return "nccl" if ig.cuda_driver else "emulated"
    name = str(backend).strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown collective backend {backend!r}; use one of {', '.join(BACKENDS)} (or None)")
    if name == "nccl" and not ig.cuda_driver:
        raise UnsupportedError("NCCL collectives", ig.name, "use backend='emulated' (loopback TCP between processes), "
                               "or IGNIS_BACKEND=cuda on a machine with GPUs")
    if name != "nccl" and not ig.host_memory:
        raise UnsupportedError("the loopback collective transport", ig.name, "use backend='nccl'")
    return name


def _timeout(t: Any) -> float:
    if isinstance(t, datetime.timedelta):
        t = t.total_seconds()
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
        raise ValueError(f"timeout must be a positive number of seconds (or a timedelta), got {t!r}")
    return float(t)


def _device(ordinal: int, env: GroupEnv) -> Device:
    try:
        return Device(ordinal)
    except ValueError as e:
        raise ValueError(f"rank {env.rank} wants device {ordinal} (LOCAL_RANK={env.local_rank}), but {e}; start "
                         "one process per device (ignis launch -n N), or pass device=") from None


def init_process_group(backend: str | None = None, timeout: Any = DEFAULT_TIMEOUT, *, rank: int | None = None,
                       world_size: int | None = None, local_rank: int | None = None,
                       master_addr: str | None = None, master_port: int | None = None,
                       device: "Device | int | None" = None) -> Communicator:
    """Join the process group and return its ``Communicator`` (the default one, if none exists).

    Args:
        backend: "nccl", "emulated", or None for the one that fits the Ignis backend.
        timeout: seconds (or a ``timedelta``) that the rendezvous, NCCL's init, and any one
            operation may wait for the other ranks before raising ``CollectiveTimeoutError``.
        rank, world_size, local_rank, master_addr, master_port: override the environment.
        device: the device to work on (default ``LOCAL_RANK``).

    Raises:
        CollectiveError: the rendezvous or the communicator's init failed (it names the ranks).
        ValueError: the environment or the arguments do not describe a valid group.
    """
    global _default, _atexit_registered
    t = _timeout(timeout)
    name = _pick_backend(backend)
    mpi = None
    if rank is None and world_size is None:
        mpi = _mpi_env()
    if mpi is not None:
        env, mpi_comm = mpi
        rdzv: Any = MpiRendezvous(mpi_comm)
    else:
        env = read_env(rank, world_size, local_rank, master_addr, master_port)
        rdzv = None
    dev = _device(env.local_rank if device is None else (device if isinstance(device, int) else device.ordinal),
                  env)
    health = Health(env.rank)
    stream = None
    try:
        if rdzv is None:
            rdzv = Rendezvous(env.master_addr, env.master_port, env.rank, env.world_size, t)
        stream = dev.create_stream()
        engine = _ENGINES[name](env, dev, health, t, rdzv, stream)
        comm = Communicator(engine, rank=env.rank, world_size=env.world_size, device=dev, stream=stream,
                            timeout=t, health=health, rendezvous=rdzv)
    except BaseException:
        if rdzv is not None:
            rdzv.close()
        if stream is not None:
            stream.close()
        raise
    dev.set_current()  # device=None now means this rank's device, as torch.cuda.set_device(LOCAL_RANK) does
    if _default is None:
        _default = comm
        comm.on_close(_forget)
        if not _atexit_registered:
            atexit.register(_close_at_exit)
            _atexit_registered = True
    return comm


def _loopback_engine(env: GroupEnv, dev: Device, health: Health, t: float, rdzv: Any, stream: Any) -> Any:
    """The loopback (TCP) engine: the ``"emulated"`` transport."""
    engine = LoopbackEngine(env.rank, env.world_size, dev, health, t)
    table = rdzv.exchange(engine.listen(rdzv.local_ip))
    rdzv.watch(health.peer_died)
    engine.connect(table)
    return engine


def _nccl_from_bindings(env: GroupEnv, dev: Device, health: Health, t: float, rdzv: Any, stream: Any) -> Any:
    """The NCCL engine over the NCCL bindings found (the ``"nccl"`` transport)."""
    from .nccl import load_bindings
    return _nccl_engine(load_bindings(), env, dev, health, t, rdzv, stream)


def _nccl_engine(api: Any, env: GroupEnv, dev: Device, health: Health, t: float, rdzv: Any,
                 stream: Any) -> Any:
    """The NCCL engine over ``api`` (the bindings), with its checker mesh (the loopback
    transport, which rooted operations use to agree on their roots first)."""
    from .nccl import NcclEngine
    checker = LoopbackEngine(env.rank, env.world_size, dev, health, t, checker=True)
    try:
        blob: dict[str, Any] = {"host": socket.gethostname(), "gpu": dev.uuid, **checker.listen(rdzv.local_ip)}
        if env.rank == 0:
            blob["nccl_id"] = api.unique_id().hex()
        table = rdzv.exchange(blob)
        _check_distinct_devices(table, env)
        rdzv.watch(health.peer_died)
        checker.connect(table)
        engine = NcclEngine(api, env.rank, env.world_size, dev, health, t, checker=checker)
        engine.init(bytes.fromhex(table[0]["nccl_id"]), stream)
    except BaseException:
        checker.abort()
        raise
    return engine


def _check_distinct_devices(table: list[dict[str, Any]], env: GroupEnv) -> None:
    seen: dict[tuple[str, str], int] = {}
    for r, blob in enumerate(table):
        key = (str(blob.get("host")), str(blob.get("gpu")))
        if key in seen:
            raise CollectiveError(f"ranks {seen[key]} and {r} use the same GPU ({key[1]}) on host {key[0]}; NCCL "
                                  "needs one GPU per rank: set LOCAL_RANK (ignis launch does) or device=",
                                  op="init_process_group", this_rank=env.rank, kind="init")
        seen[key] = r


# collective transport (BACKENDS) -> the function that makes its engine
_ENGINES = {"emulated": _loopback_engine, "nccl": _nccl_from_bindings}


def get_communicator() -> Communicator:
    """The default communicator (the first one ``init_process_group()`` made)."""
    if _default is None:
        raise RuntimeError("no process group: call ig.collective.init_process_group() first")
    return _default


def is_initialized() -> bool:
    """True while a default communicator exists (``init_process_group`` was called and
    ``destroy_process_group`` not since)."""
    return _default is not None


def destroy_process_group() -> None:
    """Close the default communicator (if any)."""
    if _default is not None:
        _default.close()


def _forget(comm: Communicator) -> None:
    global _default
    if _default is comm:
        _default = None


def _close_at_exit() -> None:
    """Close the default communicator at interpreter exit; after an uncaught exception
    (``sys.last_exc``), abort it saying why, so the peers name the cause, not a clean close."""
    if _default is not None:
        try:
            exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
            if exc is not None:
                _default._abandon(f"its program raised {type(exc).__name__}: {exc}, and is exiting")
            else:
                _default.close()
        except Exception:
            pass
