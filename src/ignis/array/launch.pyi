# Type stub of the compiled module ignis.array.launch (its source: src/ignis/array/launch.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any
from ignis.runtime.kernel import Kernel
from ignis.runtime.stream import Stream
__all__ = ['launch']

def launch(kernel: Kernel, grid: Any, block: Any, *args: Any, stream: Stream | None=..., shared_mem: int=...) -> None:
    ...
