# Type stub of the compiled module ignis.torch._guard_fast (its source: src/ignis/torch/_guard_fast.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
__all__ = ['torch_guard_bind', 'torch_guard_poison', 'torch_guard_timing']

def torch_guard_bind(alloc: object, free: object) -> tuple:
    ...

def torch_guard_timing(on: bool) -> tuple:
    ...

def torch_guard_poison(memset: int, ctx_device: int, poison: int, blocks: dict | None, rs: set | None, memset32: int=...) -> None:
    ...
