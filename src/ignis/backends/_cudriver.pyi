# Type stub of the compiled module ignis.backends._cudriver (its source: src/ignis/backends/_cudriver.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
__all__ = ['entry_points', 'load', 'load_error', 'resolved_via', 'CUDA_ABI_VERSION']
CUDA_ABI_VERSION: int

def entry_points() -> dict[str, int]:
    ...

def load() -> dict[str, int]:
    ...

def load_error() -> str | None:
    ...

def resolved_via() -> str:
    ...
