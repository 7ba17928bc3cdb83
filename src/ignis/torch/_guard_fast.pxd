# PyTorch's allocator entry points (_guard_fast.pyx) keep no typed state of their own: the
# front's state is ignis.memory.guard_alloc's (State), the guard's ignis.memory.guard_base's.
