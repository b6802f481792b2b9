"""The exceptions gemmbn raises for bad input, before anything runs.

The reference model's errors (nn.Linear's dtype and shape mismatches) are RuntimeErrors, so each of
gemmbn's is a RuntimeError too, and code written to catch the reference's catches ours. Each is also the
Python type that says what was wrong (TypeError, ValueError), as gemmbn raised before.
"""

from __future__ import annotations


class GemmBnTypeError(RuntimeError, TypeError):
    """A wrong type or dtype."""


class GemmBnValueError(RuntimeError, ValueError):
    """A wrong shape, device or value."""
