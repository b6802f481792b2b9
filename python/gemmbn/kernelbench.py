"""KernelBench level 2, problem 33 (Gemm_Scale_BatchNorm) at the benchmark size, with gemmbn's ModelNew.

``Model`` is the problem's reference module; ``ModelNew`` the drop-in with the same constructor
arguments, parameter names and initialization order (one seed, identical parameters).
"""

from __future__ import annotations

import torch

from .modules import GemmScaleBatchNorm as ModelNew
from .reference import ReferenceModel as Model

__all__ = ["Model", "ModelNew", "batch_size", "in_features", "out_features", "scale_shape",
           "get_inputs", "get_init_inputs"]  # fmt: skip

batch_size = 16384
in_features = 4096
out_features = 4096
scale_shape = (out_features,)


def get_inputs():
    """[x] with x ~ U[0, 1) of shape [batch_size, in_features]."""
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    """Constructor arguments of Model and ModelNew: [in_features, out_features, scale_shape]."""
    return [in_features, out_features, scale_shape]
