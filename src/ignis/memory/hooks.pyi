# Type stub of the compiled module ignis.memory.hooks (its source: src/ignis/memory/hooks.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any
from typing import Callable
__all__ = ['Hooks', 'HOOKS', 'set_checker', 'set_recorder', 'note_manual', 'refuse_assignment', 'capture_stack', 'format_stack']
HOOKS: Hooks

def set_checker(checker: object | None) -> object | None:
    ...

def set_recorder(recorder: Callable[[str, Any, int, int, Any, Any], None] | None) -> Callable[[str, Any, int, int, Any, Any], None] | None:
    ...

def capture_stack(skip: int=..., limit: int=...) -> tuple:
    ...

def format_stack(frames: object) -> str | None:
    ...

def refuse_assignment(module: str, refusals: dict[str, str]) -> None:
    ...

def note_manual() -> None:
    ...

class Hooks:

    @property
    def checker(self) -> object | None:
        ...

    @property
    def recorder(self) -> Callable[[str, Any, int, int, Any, Any], None] | None:
        ...

    @property
    def any_manual(self) -> bool:
        ...

    @property
    def format_frames(self) -> Callable[[Any], str] | None:
        ...

    def __repr__(self) -> str:
        ...
