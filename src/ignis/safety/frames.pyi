# Type stub of the compiled module ignis.safety.frames (its source: src/ignis/safety/frames.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any
__all__ = ['capture_frames', 'format_frames', 'add_library_dir', 'is_user_file', 'resolve', 'sites', 'MAX_FRAMES', 'last_from_library']
MAX_FRAMES: int

def last_from_library() -> bool:
    ...

def add_library_dir(path: str, *, machinery: bool=...) -> None:
    ...

def capture_frames(skip: int=..., limit: int=...) -> tuple:
    ...

def is_user_file(filename: str) -> bool:
    ...

def resolve(frames: Any) -> list[tuple[str, int, str]]:
    ...

def sites(frames: Any) -> tuple:
    ...

def format_frames(frames: Any) -> str:
    ...
