"""Telemetry (layer 7): see the memory.

- ``memory_stats`` / ``memory_summary`` / ``reset_peak_stats``: the numbers of a
  device's memory (current values always; peaks and totals after ``enable_stats()``).
- ``record_memory_history`` / ``snapshot`` / ``dump_snapshot``: allocation
  history with Python frames and the memory state, in the pickle layout that
  PyTorch's memory viewer (https://pytorch.org/memory_viz) loads.
- ``plot_timeline``: memory over time, stacked by tag or allocation site (matplotlib).
- ``replay``: an allocation log (RMM's CSV, or Ignis's ``LoggingResource``)
  replayed against a resource: time, peak reserved memory, fragmentation, failures.

Rules: nothing here costs the allocation hot path anything unless statistics
or history are switched on; then each allocation event makes one call into
this package (``_hook``).
"""

from . import _torch  # noqa: F401  (answers torch.cuda.memory_stats & co. under the guard)
from .plot import plot_timeline
from .replay import replay
from .snapshot import dump_snapshot, is_recording, load_snapshot, record_memory_history, snapshot
from .stats import disable_stats, enable_stats, memory_stats, memory_summary, reset_peak_stats, stats_enabled

__all__ = ["memory_stats", "memory_summary", "reset_peak_stats", "enable_stats", "disable_stats", "stats_enabled",
           "record_memory_history", "is_recording", "snapshot", "dump_snapshot", "load_snapshot", "plot_timeline",
           "replay"]
