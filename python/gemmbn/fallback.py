"""The warning issued when a call runs the PyTorch reference instead of the fused kernels."""

from __future__ import annotations

import warnings

# Reasons already reported in this process: each is said once, however often the layer runs.
_reported: set[str] = set()


class GemmBnFallbackWarning(UserWarning):
    """A gemmbn call ran the PyTorch reference path instead of the fused kernels."""


def warn_once(reason: str) -> None:
    """Warn with GemmBnFallbackWarning naming ``reason``, the first time this reason occurs."""
    if reason in _reported:
        return
    _reported.add(reason)
    warnings.warn(
        f"gemmbn: running the PyTorch reference instead of the fused kernels: {reason}",
        GemmBnFallbackWarning,
        stacklevel=2,
    )


def reset() -> None:
    """Forget the reasons already reported, so each warns again (for tests)."""
    _reported.clear()
