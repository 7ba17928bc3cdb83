"""``ignis bench``: run the benchmarks of ``benchmarks/`` that apply here and collect their ratios.

Design:
- Each benchmark runs as its own subprocess (``python bench_X.py ...``) with
  the Ignis being run on its ``PYTHONPATH``, so one that crashes or leaks
  cannot disturb the others, and each measures in a clean process as it was
  written to. A progress bar on stderr shows which one runs and for how long.
- Known benchmarks (``alloc``, ``array``, ``safetensors``, ``ipc``,
  ``allreduce``, ``torch_sanitizer``) have their quick and full arguments and their
  needs (modules, GPUs) here (one whose needs are not met is skipped, saying why:
  a machine without a GPU runs what applies and succeeds), and their results are
  read from their ``--json`` file (for ``safetensors``, from its printed summary). Any other
  ``bench_*.py`` is run when its ``--help`` offers ``--quick`` (quick mode) or
  in full mode, and reported as "ran" with its exit status.
- Results become rows (benchmark, metric, Ignis value, anchor, anchor value,
  ratio Ignis / anchor, unit); a Markdown table and a JSON file are written to
  ``--out``. On the emulated backend everything runs in quick mode and rows
  timing the emulator are marked: those numbers are host-side and mean nothing
  about a GPU; backend call counts and byte-exactness still do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, TextIO

from ..units import format_bytes

__all__ = ["run_benchmarks", "find_bench_dir", "Row"]

_SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds the ignis package
EMULATED_NOTE = ("emulated backend: timings measure the host-side emulator and mean nothing about a GPU; "
                 "backend call counts and correctness checks still hold")


@dataclass
class Row:
    """One result: ``ratio`` is ignis / anchor (below 1.0: Ignis is faster, for times)."""

    bench: str
    metric: str
    ignis: float | None
    unit: str
    anchor: str | None = None
    anchor_value: float | None = None
    ratio: float | None = None
    meaningful_here: bool = True


@dataclass(frozen=True)
class _Known:
    name: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    json: bool
    needs: tuple[str, ...] = ()   # importable modules
    gpus: int = 0                 # CUDA devices it needs (0: runs on any backend)


_KNOWN = {
    "bench_alloc.py": _Known("alloc", ("--quick",), (), True),
    "bench_array.py": _Known("array", ("--quick",), (), True),
    "bench_safetensors.py": _Known("safetensors", ("--size-gb", "0.05", "--repeats", "2", "--no-cold"),
                                   ("--size-gb", "1", "--repeats", "3"), False, ("safetensors", "ignis.io")),
    "bench_ipc.py": _Known("ipc", ("--quick",), (), True, ("ignis.ipc",)),
    "bench_allreduce.py": _Known("allreduce", ("--max-mib", "64", "--trials", "3"), (), True,
                                 ("torch", "ignis.collective"), gpus=2),
    "bench_torch_sanitizer.py": _Known("torch_sanitizer", ("--quick",), (), False, ("torch",), gpus=1),
}


def find_bench_dir(explicit: str | None = None) -> str | None:
    """``explicit``, else ``benchmarks/`` of the source checkout Ignis runs from, else of the current directory."""
    for d in ([explicit] if explicit else [os.path.join(os.path.dirname(_SRC), "benchmarks"),
                                           os.path.join(os.getcwd(), "benchmarks")]):
        if d and os.path.isdir(d):
            return d
    return None


def _missing(mods: tuple[str, ...]) -> list[str]:
    out = []
    for m in mods:
        try:
            if importlib.util.find_spec(m) is None:
                out.append(m)
        except (ImportError, ValueError):
            out.append(m)
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_SRC] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class _Bar:
    """A one-line progress bar on ``out`` (a line per change when it is not a terminal)."""

    def __init__(self, total: int, out: TextIO) -> None:
        self.total, self.out, self.done = total, out, 0
        self.tty = bool(getattr(out, "isatty", lambda: False)())

    def show(self, label: str, elapsed: float, final: bool = False) -> None:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label} ({elapsed:.1f} s)"
        if self.tty:
            self.out.write("\r\033[K" + line + ("\n" if final else ""))
        elif final:
            self.out.write(line + "\n")
        self.out.flush()


def _run(cmd: list[str], timeout: float, bar: _Bar, label: str) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), text=True)
        while True:
            try:
                rc = p.wait(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                if time.perf_counter() - t0 > timeout:
                    p.kill()
                    p.wait()
                    rc = -9
                    break
                bar.show(label, time.perf_counter() - t0)
        log.seek(0)
        text = log.read()
    return rc, text, time.perf_counter() - t0


def _help_flags(path: str) -> set[str]:
    try:
        p = subprocess.run([sys.executable, path, "--help"], capture_output=True, text=True, timeout=60, env=_env())
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(re.findall(r"--[a-z][a-z0-9-]*", p.stdout)) if p.returncode == 0 else set()


# -- reading results ---------------------------------------------------------------------------------
def _rows_alloc(r: dict[str, Any], emulated: bool) -> list[Row]:
    rows: list[Row] = []
    labels = r.get("labels", {})
    for size, cells in r.get("pairs", {}).items():
        mine = cells.get("ignis_pool")
        if not mine:
            continue
        anchors = [k for k in cells if not k.startswith("ignis")]
        for k in anchors or [None]:
            a = cells.get(k) if k else None
            rows.append(Row("alloc", f"allocate+free {size}", mine["median_us"], "us/pair",
                            labels.get(k, k) if k else None, a["median_us"] if a else None,
                            mine["median_us"] / a["median_us"] if a and a["median_us"] else None, not emulated))
    for key, v in (r.get("tracked_use") or {}).items():
        if isinstance(v, dict) and "median_us" in v:
            rows.append(Row("alloc", f"tracked use, {key.replace('_', ' ')}", v["median_us"], "us/use",
                            meaningful_here=not emulated))
            calls = v.get("calls_per_use", {}).get("total")
            if calls is not None:
                rows.append(Row("alloc", f"tracked use, {key.replace('_', ' ')}: backend calls", calls, "calls/use"))
    return rows


def _rows_array(r: dict[str, Any], emulated: bool) -> list[Row]:
    rows: list[Row] = []
    for nbytes, cells in (r.get("empty_free_us") or {}).items():
        mine = cells.get("ignis")
        others = [k for k in cells if k != "ignis"]
        for k in others or [None]:
            label = format_bytes(int(nbytes))
            rows.append(Row("array", f"empty+free {label}", mine, "us/pair", k, cells.get(k) if k else None,
                            mine / cells[k] if k and cells.get(k) else None, not emulated))
    c = r.get("copy_gbps") or {}
    for mine, peak, what in (("from_numpy", "pinned_h2d", "host->device"), ("to_numpy", "pinned_d2h", "device->host")):
        if mine in c and peak in c:
            rows.append(Row("array", f"{mine} ({what})", c[mine], "GB/s", "pinned copy peak", c[peak],
                            c[mine] / c[peak] if c[peak] else None, not emulated))
    cl = r.get("clone") or {}
    if "ignis_gbps" in cl:
        t = cl.get("torch_gbps")
        rows.append(Row("array", "clone", cl["ignis_gbps"], "GB/s", "torch clone" if t else None, t,
                        cl["ignis_gbps"] / t if t else None, not emulated))
    return rows


_NUM = r"([0-9.]+)"


def _rows_safetensors(text: str, emulated: bool) -> list[Row]:
    rows: list[Row] = []
    m = re.search(rf"pinned htod / dtoh\s+{_NUM} / {_NUM} GB/s", text)
    h2d, d2h = (float(m.group(1)), float(m.group(2))) if m else (None, None)
    m = re.search(rf"ig\.io load \(page cache\)\s+{_NUM} GB/s", text)
    if m:
        v = float(m.group(1))
        rows.append(Row("safetensors", "load (page cache)", v, "GB/s", "pinned htod peak", h2d,
                        v / h2d if h2d else None, not emulated))
        t = re.search(rf"safetensors\.torch load_file\s+{_NUM} GB/s", text)
        if t:
            tv = float(t.group(1))
            rows.append(Row("safetensors", "load (page cache)", v, "GB/s", "safetensors.torch", tv, v / tv,
                            not emulated))
    for w, v in re.findall(rf"ig\.io save \((\w+)\s*\) to \S+\s+{_NUM} GB/s", text):
        rows.append(Row("safetensors", f"save ({w})", float(v), "GB/s", "pinned dtoh peak", d2h,
                        float(v) / d2h if d2h else None, not emulated))
    for w, same in re.findall(r"writer=(\w+)\s.*byte-identical to the reference file: (\w+)", text):
        rows.append(Row("safetensors", f"save ({w}) byte-identical", 1.0 if same == "True" else 0.0, "bool"))
    return rows


def _rows_ipc(r: dict[str, Any], emulated: bool) -> list[Row]:
    rows: list[Row] = []
    lat = (r.get("latency_us") or {}).get("end_to_end") or {}
    if "median" in lat:
        rows.append(Row("ipc", f"share a {r.get('array_mib', '?')} MiB array, end to end", lat["median"], "us",
                        meaningful_here=not emulated))
    bw = r.get("bandwidth_GBps") or {}
    shared, local = (bw.get("shared_to_local") or {}).get("median"), (bw.get("local_to_local") or {}).get("median")
    if shared is not None:
        rows.append(Row("ipc", "copy from shared memory", shared, "GB/s", "local copy", local,
                        shared / local if local else None, not emulated))
    if "copy_ok" in r:
        rows.append(Row("ipc", "copies of shared memory correct", 1.0 if r["copy_ok"] else 0.0, "bool"))
    return rows


def _rows_allreduce(r: dict[str, Any], emulated: bool) -> list[Row]:
    rows = [Row("allreduce", f"all_reduce {format_bytes(row['bytes'])} bus bandwidth", row.get("ignis_busbw_gbps"),
                "GB/s", "torch.distributed", row.get("torch_busbw_gbps"), row.get("ratio"), not emulated)
            for row in r.get("allreduce", []) if "bytes" in row]
    book = r.get("bookkeeping") or {}
    if "ignis_minus_raw_us" in book:
        rows.append(Row("allreduce", "host cost over a raw NCCL call", book["ignis_minus_raw_us"], "us/call",
                        meaningful_here=not emulated))
    return rows


_READERS: dict[str, Callable[..., list[Row]]] = {"alloc": _rows_alloc, "array": _rows_array, "ipc": _rows_ipc,
                                                 "allreduce": _rows_allreduce}


# -- output ---------------------------------------------------------------------------------------
def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    """The results as a Markdown document with one table."""
    lines = [f"# ignis bench: {meta.get('card', '?')} ({meta.get('backend', '?')} backend, {meta.get('mode')} mode)",
             ""]
    if meta.get("note"):
        lines += [f"> {meta['note']}", ""]
    lines += ["| benchmark | metric | ignis | unit | anchor | anchor value | ignis / anchor | meaningful here |",
              "|---|---|---:|---|---|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.bench} | {r.metric} | {_fmt(r.ignis)} | {r.unit} | {r.anchor or '-'} | "
                     f"{_fmt(r.anchor_value)} | {_fmt(r.ratio)} | {'yes' if r.meaningful_here else 'no (emulated)'} |")
    runs = meta.get("runs", {})
    if runs:
        lines += ["", "| benchmark | status | seconds |", "|---|---|---:|"]
        for name, run in runs.items():
            lines.append(f"| {name} | {run['status']} | {run.get('seconds', 0):.1f} |")
    return "\n".join(lines) + "\n"


# -- the command -----------------------------------------------------------------------------------
def run_benchmarks(out_dir: str = "bench-results", *, quick: bool = True, only: list[str] | None = None,
                   bench_dir: str | None = None, timeout: float | None = None, out: TextIO | None = None,
                   progress: TextIO | None = None) -> int:
    """Run the benchmarks, print the ratios, write ``bench.md`` and ``bench.json``
    to ``out_dir``. Returns 0 when every benchmark that ran succeeded, else 1
    (2 when there is nothing to run)."""
    from ..runtime import Device, device_count

    out = out or sys.stdout
    progress = progress or sys.stderr
    d = find_bench_dir(bench_dir)
    if d is None:
        print("ignis bench: no benchmarks/ directory found; run it from a source checkout of Ignis "
              "or pass --bench-dir", file=out)
        return 2
    dev = Device(0)
    emulated = not dev.backend.gpu_timings  # the numbers say nothing about a GPU
    quick = quick or emulated
    files = sorted(f for f in os.listdir(d) if f.startswith("bench_") and f.endswith(".py"))
    plan: list[tuple[str, str, list[str], bool]] = []   # name, file, args, reads json
    runs: dict[str, dict[str, Any]] = {}
    for f in files:
        k = _KNOWN.get(f)
        name = k.name if k else f[len("bench_"):-3]
        if only and name not in only:
            continue
        if k is not None:
            miss = _missing(k.needs)
            if k.gpus and (not dev.backend.cuda_driver or device_count() < k.gpus):
                runs[name] = {"status": f"skipped: needs {'a CUDA GPU' if k.gpus == 1 else f'{k.gpus} CUDA GPUs'}"}
                continue
            if miss:
                runs[name] = {"status": f"skipped: needs {', '.join(miss)}"}
                continue
            plan.append((name, f, list(k.quick if quick else k.full), k.json))
            continue
        flags = _help_flags(os.path.join(d, f))
        if quick and "--quick" not in flags:
            runs[name] = {"status": "skipped: no --quick mode (run ignis bench --full)"}
            continue
        plan.append((name, f, ["--quick"] if quick else [], "--json" in flags))
    if not plan:
        print(f"ignis bench: nothing to run in {d}" + (f" (asked for {', '.join(only)})" if only else ""), file=out)
        for name, run in runs.items():
            print(f"  {name}: {run['status']}", file=out)
        return 2
    os.makedirs(out_dir, exist_ok=True)
    print(f"ignis bench: {len(plan)} benchmark(s) from {d} on {dev.name} ({dev.backend.name} backend, "
          f"{'quick' if quick else 'full'} mode)", file=out)
    if emulated:
        print(f"note: {EMULATED_NOTE}", file=out)
    out.flush()
    bar = _Bar(len(plan), progress)
    rows: list[Row] = []
    limit = timeout if timeout is not None else (300.0 if quick else 1800.0)
    failed = False
    for name, f, args, reads_json in plan:
        json_path = os.path.join(out_dir, f"{name}.json")
        cmd = [sys.executable, os.path.join(d, f), *args] + (["--json", json_path] if reads_json else [])
        rc, text, secs = _run(cmd, limit, bar, name)
        bar.done += 1
        bar.show(name, secs, final=True)
        with open(os.path.join(out_dir, f"{name}.log"), "w") as log:
            log.write(text)
        run: dict[str, Any] = {"status": "ok" if rc == 0 else ("timed out" if rc == -9 else f"failed (exit {rc})"),
                               "seconds": secs, "command": cmd}
        runs[name] = run
        if rc != 0:
            failed = True
            tail = "\n".join(text.strip().splitlines()[-5:])
            print(f"{name}: {run['status']}; last lines:\n{tail}", file=out)
            continue
        try:
            if name == "safetensors":
                got = _rows_safetensors(text, emulated)
            elif reads_json and name in _READERS and os.path.exists(json_path):
                with open(json_path) as fh:
                    got = _READERS[name](json.load(fh), emulated)
            else:
                got = []
        except Exception as e:  # a benchmark changed its output: report, do not crash
            run["status"] = f"ok, but its results could not be read ({type(e).__name__}: {e})"
            got = []
        rows += got
    meta = {"card": dev.name, "backend": dev.backend.name, "mode": "quick" if quick else "full",
            "python": sys.version.split()[0], "bench_dir": d, "runs": runs,
            "note": EMULATED_NOTE if emulated else None,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    md = markdown(rows, meta)
    with open(os.path.join(out_dir, "bench.md"), "w") as fh:
        fh.write(md)
    with open(os.path.join(out_dir, "bench.json"), "w") as fh:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, fh, indent=2, default=str)
        fh.write("\n")
    print("", file=out)
    print(md, file=out)
    print(f"wrote {os.path.join(out_dir, 'bench.md')} and {os.path.join(out_dir, 'bench.json')} "
          f"(raw output: {out_dir}/<name>.log, <name>.json)", file=out)
    return 1 if failed else 0
