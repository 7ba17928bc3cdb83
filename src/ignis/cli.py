"""The ``ignis`` command line (layer 7).

    ignis doctor [--json] [--device N] [--size-mib N] [--repeats N] [--no-bandwidth]
    ignis demo [--device N]
    ignis run [--sanitize] [--guard] [--leaks] [--ordering auto|manual] SCRIPT [ARGS...]
    ignis load FILE [--device N]
    ignis launch -n N SCRIPT [ARGS...]
    ignis snapshot plot|summary FILE [-o OUT.png]
    ignis replay LOG.csv --resource pool|async|direct|guard [--budget BYTES]
    ignis bench [--out DIR]

``main(argv)`` returns the exit status instead of exiting (argparse's usage
errors give 2), so it can be called in-process; the console script and
``python -m ignis`` hand it to ``sys.exit``.

``doctor`` reports; it does not stop at the first problem. Each problem it
meets is listed at the end, and any problem makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from typing import Any, Sequence, TextIO

from ._cliargs import ordinal as _ordinal
from ._cliargs import positive_int as _positive_int
__all__ = ["main", "doctor_report"]

EMULATED_NOTE = ("emulated backend: these are host memcpy speeds and mean nothing about a GPU "
                 "(run on a CUDA machine for real numbers)")


# -- doctor: gathering -------------------------------------------------------------
def _library_versions() -> dict[str, str | None]:
    import ml_dtypes
    import numpy as np

    from . import __version__

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

    from .memory import DirectResource, PinnedHostResource
    from .runtime import Device

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
                              "versions": _library_versions(), "bandwidth": None, "problems": problems}
    try:
        from .backends import get_backend
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
    if bandwidth and count:
        if not 0 <= device < count:
            problems.append(f"bandwidth probe: device {device} does not exist (valid: 0..{count - 1})")
        else:
            try:
                report["bandwidth"] = probe_bandwidth(device, nbytes, repeats)
            except Exception as e:
                problems.append(f"bandwidth probe on device {device}: {type(e).__name__}: {e}")
    return report


# -- doctor: printing ----------------------------------------------------------------
def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _print_doctor(report: dict[str, Any], out: TextIO) -> None:
    from .units import format_bytes

    def say(line: str = "") -> None:
        print(line, file=out)

    v = report["versions"]
    say(f"ignis {v['ignis']} doctor")
    say(f"backend: {report['backend'] or 'none'}")
    from . import backends
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


# -- commands ----------------------------------------------------------------------------
def _cmd_doctor(args: argparse.Namespace) -> int:
    report = doctor_report(device=args.device, nbytes=args.size_mib << 20, repeats=args.repeats,
                           bandwidth=not args.no_bandwidth)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_doctor(report, sys.stdout)
    return 1 if report["problems"] else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run
    from .runtime import Device
    from .telemetry.tour import tour
    with Device(args.device):  # what the demo makes without naming a device lands there too
        rc = run(sys.stdout, device=args.device)
        return tour(sys.stdout, device=args.device) or rc


def _cmd_run(args: argparse.Namespace) -> int:
    from .runner import run_script
    return run_script(args.script, args.args, sanitize=args.sanitize, guard=args.guard, leaks=args.leaks,
                      ordering=args.ordering, leak_threshold=args.leak_threshold)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="ignis", description="Ignis: a memory-safe GPU buffer runtime.",
        epilog="The backend is chosen by IGNIS_BACKEND=auto|cuda|emulated (default auto).")
    parser.add_argument("--version", action="version", version=f"ignis {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    doctor = sub.add_parser("doctor", help="report the backend, devices, versions and copy bandwidth",
                            description="Report the backend, its devices, driver and library versions, "
                                        "and a short host<->device copy bandwidth probe.")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--device", type=_ordinal, default=0, help="device to probe (default 0)")
    doctor.add_argument("--size-mib", type=_positive_int, default=64, metavar="N",
                        help="bytes per probe copy, in MiB (default 64)")
    doctor.add_argument("--repeats", type=_positive_int, default=5, metavar="N",
                        help="timed copies per case, after one warm-up (default 5)")
    doctor.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth probe")
    doctor.set_defaults(func=_cmd_doctor)

    demo = sub.add_parser("demo", help="a short end-to-end run and a tour: streams, tracked copies, pool reuse, "
                                       "safetensors, a KV cache, one caught bug of each class, a timeline",
                          description="Copy bytes host -> device -> device -> host across two streams "
                                      "with cross-stream tracking, check them, show pool reuse across "
                                      "streams and a caught double free.")
    demo.add_argument("--device", type=_ordinal, default=0, help="device to run on (default 0)")
    demo.set_defaults(func=_cmd_demo)

    run = sub.add_parser("run", help="run a Python script under the sanitizer, the debug guard and/or "
                                     "the leak audit",
                         description="Run SCRIPT with Ignis's checks on and print their reports at exit. "
                                     "The exit status is non-zero when a problem was found.")
    run.add_argument("--sanitize", action="store_true",
                     help="check cross-stream races, uses after free, reuse races and uninitialized reads, in "
                          "Ignis's tracked uses and in PyTorch ops on CUDA tensors (the script's ordering "
                          "policy is kept)")
    run.add_argument("--guard", action="store_true",
                     help="canaries, poison and quarantine on every allocation (DebugGuardResource)")
    run.add_argument("--leaks", action="store_true", help="report arrays still alive at exit, with their sites")
    run.add_argument("--ordering", choices=("auto", "manual"), default=None,
                     help="ordering policy for Ignis's tracked uses (default: the script's own; 'manual' "
                          "with --sanitize checks the script's synchronization instead of supplying it)")
    run.add_argument("--leak-threshold", type=float, default=0.0, metavar="SECONDS",
                     help="only report arrays older than this (default 0)")
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    run.set_defaults(func=_cmd_run)

    from .collective.cli import add_parser as add_launch_parser
    from .io.cli import add_parser as add_load_parser
    from .telemetry.cli import add_parsers as add_telemetry_parsers
    add_load_parser(sub)
    add_launch_parser(sub)
    add_telemetry_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ignis`` command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error (already printed)
        return e.code if isinstance(e.code, int) else 2
    device = getattr(args, "device", None)  # (doctor reports a missing device in its own report)
    if isinstance(device, int) and not isinstance(device, bool) and args.command != "doctor":
        problem = _bad_device(device)
        if problem:
            print(f"ignis {args.command}: {problem}", file=sys.stderr)
            return 1
    return args.func(args)


def _bad_device(ordinal: int) -> str | None:
    """Why ``--device ordinal`` cannot be used on this machine, or None."""
    from .backends import get_backend
    try:
        backend = get_backend()
        count = backend.device_count()
    except Exception as e:  # no backend at all: the command itself says more
        return f"no device can be used ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    if not 0 <= ordinal < count:
        return (f"--device {ordinal} does not exist: the {backend.name} backend has {count} device(s) "
                f"(valid: {'0..' + str(count - 1) if count else 'none'}); `ignis doctor` lists them")
    return None
