# Types for the compiled build of matching.py (Cython's pure-Python mode): the call
# matcher's thread turns every call into its descriptor, and it holds the GIL meanwhile,
# so the descriptor is made from the operation's C fields. matching.py stays the one source.

from ignis.collective.communicator cimport _Op

cdef tuple _row(_Op op)
