"""KernelBench level 2's Gemm_Scale_BatchNorm problems, each with gemmbn's drop-in as ModelNew.

- Problem 39: 16384x4096 -> 4096, the size gemmbn is tuned at. This module's top-level names are problem 39's
  (KernelBench loads a problem as a module with Model, get_inputs and get_init_inputs).
- Problem 33: 1024x8192 -> 8192. ``problem(33)`` gives its names.

``Model`` is the problems' reference module; ``ModelNew`` the drop-in with the same constructor arguments,
parameter names and initialization order (one seed, identical parameters).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from .modules import GemmScaleBatchNorm as ModelNew
from .reference import ReferenceModel as Model

__all__ = ["Model", "ModelNew", "PROBLEMS", "batch_size", "in_features", "out_features", "scale_shape",
           "get_inputs", "get_init_inputs", "problem"]  # fmt: skip

PROBLEMS = {39: (16384, 4096, 4096), 33: (1024, 8192, 8192)}  # number -> (batch_size, in_features, out_features)

batch_size, in_features, out_features = PROBLEMS[39]
scale_shape = (out_features,)


def get_inputs():
    """[x] with x ~ U[0, 1) of shape [batch_size, in_features]."""
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    """Constructor arguments of Model and ModelNew: [in_features, out_features, scale_shape]."""
    return [in_features, out_features, scale_shape]


def problem(number: int) -> SimpleNamespace:
    """KernelBench level 2 problem ``number`` (33 or 39) as the names its harness reads: Model, ModelNew,
    batch_size, in_features, out_features, scale_shape, get_inputs, get_init_inputs."""
    if number not in PROBLEMS:
        raise ValueError(f"gemmbn has KernelBench level 2 problems {sorted(PROBLEMS)}, not {number}")
    rows, k, n = PROBLEMS[number]
    return SimpleNamespace(
        Model=Model, ModelNew=ModelNew, batch_size=rows, in_features=k, out_features=n, scale_shape=(n,),
        get_inputs=lambda: [torch.rand(rows, k)], get_init_inputs=lambda: [k, n, (n,)],
    )  # fmt: skip
