"""Errors of the collective layer (defined with every other error in ``ignis.errors``).

``CollectiveError`` is raised when an operation cannot complete; once a
communicator has failed it stays failed: every later operation raises at once.
"""

from ..errors import CollectiveError, CollectiveTimeoutError

__all__ = ["CollectiveError", "CollectiveTimeoutError"]
