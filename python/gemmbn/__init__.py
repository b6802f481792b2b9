"""gemmbn: BatchNorm1d(Linear(x) * scale) in training mode as fused Hopper (sm90) kernels.

    from gemmbn import GemmScaleBatchNorm
    layer = GemmScaleBatchNorm.from_module(model)   # or GemmScaleBatchNorm(in, out, scale_shape)

Where the fused kernels cannot run (no sm90 GPU, no built extension, unsupported dtype or sizes) the
same semantics run in PyTorch and a GemmBnFallbackWarning says why, once per reason.
gemmbn.kernelbench holds KernelBench level 2 problems 39 and 33 with the drop-in as ModelNew.
"""

from . import kernelbench
from ._native import fused_unavailable_reason
from .distributed import convert_sync_batchnorm
from .fallback import GemmBnFallbackWarning
from .functional import linear_scale_batch_norm
from .modules import GemmScaleBatchNorm
from .plan import fused_plan
from .reference import ReferenceModel

__version__ = "0.1.0"

__all__ = [
    "GemmBnFallbackWarning",
    "GemmScaleBatchNorm",
    "ReferenceModel",
    "__version__",
    "convert_sync_batchnorm",
    "kernelbench",
    "fused_plan",
    "fused_unavailable_reason",
    "linear_scale_batch_norm",
]
