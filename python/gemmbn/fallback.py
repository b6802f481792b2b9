"""The warning issued when a call runs the PyTorch reference instead of the fused kernels."""

from __future__ import annotations

import os
import sys
import warnings

import torch

# Reasons already reported in this process: each is said once, however often the layer runs.
_reported: set[str] = set()
# Frames in these directories are not the caller a warning should point at (gemmbn's own calls, nn.Module's
# __call__, autograd, torch.compile).
_INTERNAL_DIRS = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
                  os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)  # fmt: skip


class GemmBnFallbackWarning(UserWarning):
    """A gemmbn call ran the PyTorch reference path instead of the fused kernels."""


def _caller_stacklevel() -> int:
    """warnings.warn's stacklevel, from its caller's frame, of the first frame outside gemmbn and torch."""
    level, frame = 2, sys._getframe(2)  # level 1: warn_once (which calls warnings.warn), 2: its caller
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INTERNAL_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def warn_once(reason: str) -> None:
    """Warn with GemmBnFallbackWarning naming ``reason``, the first time this reason occurs, at the line of the
    user's code that called into gemmbn."""
    if reason in _reported:
        return
    _reported.add(reason)
    warnings.warn(
        f"gemmbn: running the PyTorch reference instead of the fused kernels: {reason}",
        GemmBnFallbackWarning,
        stacklevel=_caller_stacklevel(),
    )


def reset() -> None:
    """Forget the reasons already reported, so each warns again (for tests)."""
    _reported.clear()
