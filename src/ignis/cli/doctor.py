"""``ignis doctor``: the backend, its devices, driver and library versions, and a short
host<->device copy bandwidth probe.

    ignis doctor [--json] [--device N] [--size-mib N] [--repeats N] [--no-bandwidth]

``doctor`` reports; it does not stop at the first problem. Each problem it
meets is listed at the end, and any problem makes the exit status 1.
``add_parser(subparsers)`` adds the command; ``doctor_report`` is what it
reports, as a JSON-ready dict (``ignis.cli.doctor_report``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from typing import Any, TextIO

from .args import ordinal as _ordinal
from .args import positive_int as _positive_int

__all__ = ["doctor_report", "probe_bandwidth", "add_parser"]

EMULATED_NOTE = ("emulated backend: these are host memcpy speeds and mean nothing about a GPU "
                 "(run on a CUDA machine for real numbers)")


# -- doctor: gathering -------------------------------------------------------------
def _torch_front_end() -> dict[str, Any] | None:
    """The PyTorch front end's state: torch's version and whether its op observer is built
    for it (None when torch is not installed). Builds nothing."""
    import importlib.util
    import os
    import shutil
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        import torch

        from ..torch import observer_build
        path, cxx = observer_build()
        return {"torch": torch.__version__, "observer": path if os.path.exists(path) else None,
                "compiler": shutil.which(cxx[0]) if cxx else None}
    except Exception as e:  # a torch that does not import: say so, go on
        return {"torch": None, "error": f"{type(e).__name__}: {e}"}


def _library_versions() -> dict[str, str | None]:
    import ml_dtypes
    import numpy as np

    from .. import __version__

    try:
        import cuda.bindings as bindings
        cuda_bindings: str | None = str(getattr(bindings, "__version__", "unknown"))
    except ImportError:
        cuda_bindings = None
    return {"ignis": __version__, "python": platform.python_version(), "numpy": np.__version__,
            "ml_dtypes": getattr(ml_dtypes, "__version__", "unknown"), "cuda-bindings": cuda_bindings}


def _device_entry(backend: Any, ordinal: int) -> dict[str, Any]:
    p = backend.device_properties(ordinal)
    return {"ordinal": p.ordinal, "name": p.name, "total_memory": p.total_memory,
            "multiprocessor_count": p.multiprocessor_count,
            "compute_capability": list(p.compute_capability), "uuid": p.uuid,
            "capabilities": p.capabilities, "extra": dict(p.extra)}


def _gbps(nbytes: int, ms: float) -> float | None:
    return nbytes / (ms * 1e6) if ms > 0 else None


def probe_bandwidth(ordinal: int, nbytes: int, repeats: int) -> dict[str, Any]:
    """Time host<->device copies of ``nbytes`` on one stream with timing events:
    pinned and pageable host memory, both directions, after one warm-up copy each."""
    import numpy as np

    from ..memory import DirectResource, PinnedHostResource
    from ..runtime import Device

    dev = Device(ordinal)
    backend = dev.backend
    # DirectResource: the probe's block must not stay cached in the current pool.
    mr = DirectResource(dev)
    pinned = PinnedHostResource(backend)
    stream = dev.create_stream()
    start = dev.create_event(timing=True)
    end = dev.create_event(timing=True)
    block = buf = None
    results = []
    try:
        block = mr.allocate(nbytes, stream, tag="ignis.doctor")
        buf = pinned.allocate(nbytes)
        buf.array.fill(1)
        pageable = np.ones(nbytes, np.uint8)
        for host, host_ptr in (("pinned", buf.ptr), ("pageable", pageable.ctypes.data)):
            for direction in ("htod", "dtoh"):
                times = []
                for i in range(repeats + 1):
                    start.record(stream)
                    if direction == "htod":
                        backend.memcpy_htod_async(block.ptr, host_ptr, nbytes, stream.handle)
                    else:
                        backend.memcpy_dtoh_async(host_ptr, block.ptr, nbytes, stream.handle)
                    end.record(stream)
                    end.synchronize()
                    if i:  # the first copy is a warm-up
                        times.append(start.elapsed_ms(end))
                rates = [r for r in (_gbps(nbytes, ms) for ms in times) if r is not None]
                results.append({"host_memory": host, "direction": direction,
                                "gbps_median": statistics.median(rates) if rates else None,
                                "gbps_best": max(rates, default=None),
                                "ms": times})
    finally:
        stream.synchronize()
        if buf is not None:
            buf.release()
        pinned.close()
        if block is not None:
            mr.deallocate(block)
        start.close()
        end.close()
        stream.close()
    report: dict[str, Any] = {"device": ordinal, "bytes": nbytes, "repeats": repeats, "results": results}
    if not backend.gpu_timings:
        report["note"] = EMULATED_NOTE
    return report


def doctor_report(*, device: int = 0, nbytes: int = 64 << 20, repeats: int = 5,
                  bandwidth: bool = True) -> dict[str, Any]:
    """What ``ignis doctor`` reports, as a JSON-ready dict. Problems met on the
    way are listed under ``"problems"`` rather than raised."""
    problems: list[str] = []
    report: dict[str, Any] = {"backend": None, "device_count": 0, "devices": [],
                              "versions": _library_versions(), "bandwidth": None, "problems": problems,
                              "torch_front_end": _torch_front_end()}
    try:
        from ..backends import get_backend
        backend = get_backend()
    except Exception as e:  # bad IGNIS_BACKEND, or IGNIS_BACKEND=cuda without a driver
        problems.append(f"the backend could not start: {type(e).__name__}: {e}")
        return report
    report["backend"] = backend.name
    try:
        report["versions"]["backend"] = dict(backend.versions())
    except Exception as e:
        problems.append(f"backend versions: {type(e).__name__}: {e}")
    try:
        count = backend.device_count()
    except Exception as e:
        problems.append(f"device count: {type(e).__name__}: {e}")
        return report
    report["device_count"] = count
    if count == 0:
        problems.append(f"the {backend.name} backend sees no device")
    for ordinal in range(count):
        try:
            report["devices"].append(_device_entry(backend, ordinal))
        except Exception as e:
            problems.append(f"device {ordinal} properties: {type(e).__name__}: {e}")
    if count and not 0 <= device < count:
        problems.append(f"device {device} does not exist (valid: 0..{count - 1})")
    elif bandwidth and count:
        try:
            report["bandwidth"] = probe_bandwidth(device, nbytes, repeats)
        except Exception as e:
            problems.append(f"bandwidth probe on device {device}: {type(e).__name__}: {e}")
    return report


# -- doctor: printing ----------------------------------------------------------------
def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _print_doctor(report: dict[str, Any], out: TextIO) -> None:
    from ..units import format_bytes

    def say(line: str = "") -> None:
        print(line, file=out)

    v = report["versions"]
    say(f"ignis {v['ignis']} doctor")
    say(f"backend: {report['backend'] or 'none'}")
    from .. import backends
    if backends.auto_fallback:
        say(f"  (IGNIS_BACKEND=auto took the emulator: {backends.auto_fallback})")
    say(f"devices: {report['device_count']}")
    for d in report["devices"]:
        caps = d["capabilities"]
        say(f"  device {d['ordinal']}: {d['name']}")
        say(f"    total memory        {format_bytes(d['total_memory'])} ({d['total_memory']} bytes)")
        say(f"    multiprocessors     {d['multiprocessor_count']}")
        say(f"    compute capability  {'.'.join(map(str, d['compute_capability']))}")
        say(f"    uuid                {d['uuid']}")
        say(f"    capabilities        vmm: {_yes(caps['vmm'])}, memory pools: {_yes(caps['memory_pools'])}, "
            f"POSIX-fd IPC: {_yes(caps['posix_fd_ipc'])}")
    say("versions:")
    backend_versions = v.get("backend")
    if backend_versions is not None:
        text = ", ".join(f"{k} {val}" for k, val in backend_versions.items()) or "(none reported)"
        say(f"  {report['backend']} backend: {text}")
    for name in ("python", "numpy", "ml_dtypes", "cuda-bindings"):
        say(f"  {name:<14}{v[name] or 'not installed'}")
    fe = report.get("torch_front_end")
    if fe is not None:
        if fe.get("torch") is None:
            say(f"PyTorch front end: torch does not import ({fe.get('error')})")
        elif fe["observer"] is not None:
            say(f"PyTorch front end: torch {fe['torch']}; op observer built ({fe['observer']})")
        elif fe["compiler"] is not None:
            say(f"PyTorch front end: torch {fe['torch']}; op observer not built yet (the first "
                f"`ignis run --sanitize` builds it once, with {fe['compiler']})")
        else:
            say(f"PyTorch front end: torch {fe['torch']}; op observer cannot be built (no C++ compiler: "
                "set CXX); the dispatch mode checks the same, slower")
    bw = report["bandwidth"]
    if bw is not None:
        say(f"host<->device copy bandwidth (device {bw['device']}, {format_bytes(bw['bytes'])} per copy, "
            f"median of {bw['repeats']}):")
        for r in bw["results"]:
            rate = f"{r['gbps_median']:.2f} GB/s" if r["gbps_median"] is not None else "not measurable"
            say(f"  {r['host_memory']:<9} {r['direction']}  {rate}")
        if "note" in bw:
            say(f"  note: {bw['note']}")
    if report["problems"]:
        say("problems:")
        for p in report["problems"]:
            say(f"  - {p}")


# -- the command -------------------------------------------------------------------------
def _command(args: argparse.Namespace) -> int:
    """``ignis doctor``: print the report (text or JSON); 1 when a problem was found, else 0."""
    report = doctor_report(device=args.device, nbytes=args.size_mib << 20, repeats=args.repeats,
                           bandwidth=not args.no_bandwidth)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_doctor(report, sys.stdout)
    return 1 if report["problems"] else 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``doctor`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); returns its parser."""
    doctor = subparsers.add_parser("doctor", help="report the backend, devices, versions and copy bandwidth",
                                   description="Report the backend, its devices, driver and library versions, "
                                               "and a short host<->device copy bandwidth probe.")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--device", type=_ordinal, default=0, help="device to probe (default 0)")
    doctor.add_argument("--size-mib", type=_positive_int, default=64, metavar="N",
                        help="bytes per probe copy, in MiB (default 64)")
    doctor.add_argument("--repeats", type=_positive_int, default=5, metavar="N",
                        help="timed copies per case, after one warm-up (default 5)")
    doctor.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth probe")
    doctor.set_defaults(func=_command)
    return doctor
