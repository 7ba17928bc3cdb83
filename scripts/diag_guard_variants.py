"""Run a program under the guard as ``ignis run --guard`` does, with guard options changed:
    python3 scripts/diag_guard_variants.py 'ready_limit=0,quarantine_count=0' program.py [args]
(``-`` for the defaults; ``direct=0``: the check batches through the backend's methods,
``guard_base.check_batches_direct``). For finding which part of the guard changes what a
program computes, or its time."""
import os
import runpy
import sys

spec, script, *rest = sys.argv[1:]
opts = {}
if spec != "-":
    for kv in spec.split(","):
        k, v = kv.split("=")
        opts[k] = {"True": True, "False": False, "None": None}.get(v, None) if v in ("True", "False", "None") \
            else int(v, 0)
import ignis as ig  # noqa: E402
from ignis.torch import _guard as tg  # noqa: E402

if "direct" in opts:  # not a guard option: 0 queues the check batches through the backend's methods
    from ignis.memory import guard_base
    guard_base.check_batches_direct(bool(opts.pop("direct")))

tg._configure(opts)
for i in range(ig.device_count()):
    tg.guard_resource(i)
tg.install_on_import()
sys.argv = [script, *rest]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
tg.finish(sys.stderr)
