"""Ignis in a child made by fork() (issue #14, item 16).

A child forked after the parent used the device has none of the parent's
device state: the emulator's stream threads and the CUDA driver's context do
not survive a fork, and work queued there used to wait forever. Every use in
such a child must raise ``ForkedProcessError`` (which says to use the
``spawn`` or ``forkserver`` start method), never hang; a child of a parent
that never touched a device, or a child that only imports Ignis, must be
fine. Real ``os.fork()`` and multiprocessing's fork context; every wait on a
child has a deadline, and a child still running at it fails the test.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from typing import Any, Callable

import numpy as np
import pytest

import ignis as ig

DEADLINE_S = 30.0


def _wait_child(pid: int, deadline: float) -> int:
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child did not exit in time (it hangs)")
        time.sleep(0.01)


def run_forked(steps: "dict[str, Callable[[], Any]]") -> dict[str, Any]:
    """Fork; in the child run each step and report one JSON line per step:
    ``{"step", "ok"}`` or ``{"step", "error", "message"}``. A child that stops
    reporting before the deadline (a hang) fails the test, naming the step."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            for name, step in steps.items():
                os.write(w, json.dumps({"step": name, "started": True}).encode() + b"\n")
                try:
                    step()
                    line = {"step": name, "ok": True}
                except Exception as exc:  # noqa: BLE001 - reported to the parent
                    line = {"step": name, "error": type(exc).__name__, "message": str(exc)}
                os.write(w, json.dumps(line).encode() + b"\n")
        except BaseException:  # noqa: BLE001
            os.write(w, json.dumps({"crash": traceback.format_exc()}).encode() + b"\n")
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + DEADLINE_S
    buf = b""
    try:
        while True:
            left = deadline - time.monotonic()
            ready = select.select([r], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                started = [json.loads(x) for x in buf.splitlines() if b'"started"' in x]
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the forked child hung in step {started[-1]['step'] if started else '?'!r}")
            chunk = os.read(r, 65536)
            if not chunk:
                break
            buf += chunk
    finally:
        os.close(r)
    assert _wait_child(pid, deadline) == 0, buf.decode()
    lines = [json.loads(x) for x in buf.splitlines()]
    crash = [x for x in lines if "crash" in x]
    assert not crash, crash[0]["crash"]
    return {x["step"]: x for x in lines if "started" not in x}


def _is_fork_error(result: dict) -> bool:
    return result.get("error") == "ForkedProcessError" and "spawn" in result["message"] \
        and "forkserver" in result["message"]


def test_a_child_forked_after_the_parent_used_ignis_raises_instead_of_hanging(dev):
    s = dev.create_stream()
    a = ig.zeros(256, "float32", stream=s)
    a.fill_(1.5)
    pool = ig.get_current_resource(dev)
    blk = pool.allocate(4096, s)
    pool.deallocate(blk)  # a cached block: the child's allocation could come from the cache
    assert float(a.to_numpy()[0]) == 1.5
    backend = dev.backend
    results = run_forked({
        "inherited stream synchronize": s.synchronize,
        "inherited array read": a.to_numpy,
        "inherited array write": lambda: a.fill_(2.0),
        "new array": lambda: ig.empty(64),
        "new array on the inherited stream": lambda: ig.zeros(64, stream=s),
        "inherited pool allocate (cached)": lambda: pool.allocate(4096, s),
        "device": lambda: ig.Device(0),
        "inherited device synchronize": dev.synchronize,
        "inherited device create_stream": dev.create_stream,
        "inherited device create_event": dev.create_event,
        "inherited backend op": lambda: backend.stream_synchronize(s.handle),
        "inherited backend query": lambda: backend.event_query(1),
        "get_backend": ig.get_backend,
    })
    for name, result in results.items():
        assert _is_fork_error(result), f"{name}: {result}"
    assert "fork" in results["device"]["message"] and str(os.getpid()) in results["device"]["message"]
    # The parent is untouched.
    a.fill_(3.0)
    assert float(a.to_numpy()[0]) == 3.0
    a.free()
    s.close()


def test_freeing_inherited_memory_in_a_forked_child_neither_raises_nor_hangs(dev):
    a = ig.zeros(256, "float32")
    a.fill_(1.0)
    b = ig.zeros(256, "float32")
    results = run_forked({"free": a.free, "drop": lambda: globals().pop("nothing", None)})
    assert results["free"].get("ok"), results["free"]
    del b
    assert float(a.to_numpy()[0]) == 1.0  # the parent's array was not freed by the child
    a.free()


def _mp_child(queue: Any) -> None:
    try:
        ig.zeros(16).to_numpy()
        queue.put(("ok", ""))
    except Exception as exc:  # noqa: BLE001
        queue.put((type(exc).__name__, str(exc)))


def test_multiprocessing_fork_context_child_gets_a_clear_error(dev):
    ig.zeros(16).fill_(1.0)  # this process has used the device
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_mp_child, args=(queue,))
    proc.start()
    try:
        kind, message = queue.get(timeout=DEADLINE_S)
    except Exception:  # noqa: BLE001 - queue.Empty: the child hangs
        proc.kill()
        proc.join()
        pytest.fail("the multiprocessing fork child did not answer (it hangs)")
    proc.join(DEADLINE_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail("the multiprocessing fork child did not exit")
    assert kind == "ForkedProcessError", (kind, message)
    assert "spawn" in message and "multiprocessing.get_context('spawn')" in message
    assert proc.exitcode == 0


def test_the_error_pickles_across_processes():
    import pickle
    err = ig.ForkedProcessError("use Ignis", backend="emulated", parent_pid=10, pid=11)
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, ig.ForkedProcessError) and isinstance(back, RuntimeError)
    assert back.parent_pid == 10 and back.pid == 11 and str(back) == str(err)


# -- fresh interpreters: what a fork child may still do ---------------------------------------

SCRIPT = textwrap.dedent(r"""
    import json, os, sys, time
    import ignis as ig
    case = sys.argv[1]

    def child(fn):
        pid = os.fork()
        if pid == 0:
            try:
                out = fn()
            except Exception as exc:
                out = {"error": type(exc).__name__, "message": str(exc)}
            print(json.dumps(out), flush=True)
            if case.endswith("normal-exit"):
                sys.exit(0)  # atexit handlers and finalizers run in the child
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    def use():
        a = ig.zeros(1000, "float32")
        a.fill_(2.0)
        s = ig.Device(0).create_stream()
        b = ig.empty(1000, stream=s)
        b.from_host(a.to_numpy() + 1)
        total = float(b.to_numpy().sum())
        b.free(); a.free(); s.close()
        return {"ok": total}

    if case == "import-only-parent":
        code = child(use)
    elif case == "device-count-only-parent":
        ig.device_count()
        code = child(use)
    elif case == "used-parent-child-imports-only-normal-exit":
        use()
        code = child(lambda: {"ok": "imported " + __import__("ignis").__name__})
    elif case == "used-parent-child-set-backend":
        use()
        code = child(lambda: (ig.set_backend(os.environ["IGNIS_BACKEND"]), use())[1])
    elif case == "used-parent":
        use()
        code = child(use)
    print(json.dumps({"parent": use(), "child_exit": code}), flush=True)
""")


def run_script(case: str, backend: str) -> tuple[list[dict], str]:
    env = dict(os.environ, IGNIS_BACKEND=backend, PYTHONFAULTHANDLER="1")
    try:
        p = subprocess.run([sys.executable, "-c", SCRIPT, case], capture_output=True, text=True, env=env,
                           timeout=DEADLINE_S * 2)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: the script hung (a forked child waits forever)")
    assert p.returncode == 0, p.stderr
    return [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")], p.stderr


@pytest.mark.parametrize("case", ["import-only-parent", "device-count-only-parent",
                                  "used-parent-child-imports-only-normal-exit", "used-parent-child-set-backend"])
def test_a_child_that_may_use_ignis_works(case):
    (child, parent), stderr = run_script(case, "emulated")
    assert "error" not in child, child
    if "imports-only" not in case:
        assert child["ok"] == 3000.0
    assert parent == {"parent": {"ok": 3000.0}, "child_exit": 0}
    for noise in ("Exception ignored", "Traceback"):
        assert noise not in stderr, stderr


def test_a_used_parent_child_in_a_fresh_interpreter_raises():
    (child, parent), stderr = run_script("used-parent", "emulated")
    assert child["error"] == "ForkedProcessError" and "spawn" in child["message"], child
    assert parent["child_exit"] == 0 and parent["parent"] == {"ok": 3000.0}
    assert "Exception ignored" not in stderr, stderr


@pytest.mark.gpu
def test_cuda_forked_child_raises_instead_of_failing_in_the_driver():
    (child, parent), stderr = run_script("used-parent", "cuda")
    assert child["error"] == "ForkedProcessError" and "'cuda'" in child["message"], child
    assert parent["child_exit"] == 0 and parent["parent"] == {"ok": 3000.0}
    (child, parent), _ = run_script("used-parent-child-imports-only-normal-exit", "cuda")
    assert "error" not in child and parent["child_exit"] == 0


def test_numpy_is_untouched_by_the_fork_guard():
    # The guard changes Ignis's state only: plain host work in a forked child still runs.
    results = run_forked({"numpy": lambda: np.arange(10).sum()})
    assert results["numpy"].get("ok")


def _assert_unlocked(lock: Any) -> None:
    assert not lock.locked(), "the parent thread's hold was inherited"
    with lock:  # and usable
        pass


def test_a_pool_lock_held_by_a_parent_thread_at_the_fork_is_replaced_in_the_child(dev):
    pool = ig.PoolResource(ig.DirectResource(dev))
    blk = pool.allocate(4096, dev.default_stream)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with pool._lock:
            held.set()
            release.wait(DEADLINE_S)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(DEADLINE_S)
    try:
        results = run_forked({
            "lock free in the child": lambda: _assert_unlocked(pool._lock),
            "allocate": lambda: pool.allocate(4096, dev.default_stream),
            "deallocate": lambda: pool.deallocate(blk),
        })
    finally:
        release.set()
        t.join(DEADLINE_S)
    assert results["lock free in the child"].get("ok"), results
    assert _is_fork_error(results["allocate"]), results["allocate"]
    assert results["deallocate"].get("ok"), results["deallocate"]  # neither raises nor hangs
    pool.deallocate(blk)
    pool.close()
