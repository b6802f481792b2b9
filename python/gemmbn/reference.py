"""Pure-PyTorch implementation of the gemmbn contract.

The one place the math lives in PyTorch ops: the test oracle, the benchmark baseline and the
fallback wherever the fused kernels cannot run. Semantics are nn.BatchNorm1d's, applied to
y = (x @ W^T + b) * s.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import GemmBnValueError


def statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype the batch statistics are kept in: float64 for float64 data, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_batch_size(num_rows: int, num_features: int) -> None:
    """Raise nn.BatchNorm1d's ValueError (gemmbn's, a RuntimeError too) when batch statistics of a single row are
    asked for: M > 1."""
    if num_rows == 1:
        size = torch.Size([num_rows, num_features])
        raise GemmBnValueError(f"Expected more than 1 value per channel when training, got input size {size}")


def linear_scale(x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor) -> Tensor:
    """The pre-normalization activation: y = (x @ W^T + b) * s."""
    return F.linear(x, weight, bias) * scale


def _update_running_stats(
    running_mean: Tensor,
    running_var: Tensor,
    num_batches_tracked: Tensor | None,
    momentum: float | None,
    mean: Tensor,
    biased_var: Tensor,
    num_rows: int,
) -> None:
    """running <- (1 - f) running + f batch, with the unbiased variance; f = momentum or 1/num_batches_tracked."""
    if momentum is not None:
        factor: float | Tensor = momentum
    elif num_batches_tracked is not None:
        # Cumulative average, computed on the device: no host synchronization.
        factor = num_batches_tracked.to(mean.dtype).reciprocal()
    else:
        # nn.BatchNorm1d's exponential_average_factor when momentum is None and nothing is tracked.
        factor = 0.0
    unbiased_var = biased_var * (num_rows / (num_rows - 1))
    running_mean.copy_(mean * factor + running_mean * (1 - factor))
    running_var.copy_(unbiased_var * factor + running_var * (1 - factor))


def linear_scale_batch_norm(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    gamma: Tensor | None,
    beta: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    num_batches_tracked: Tensor | None,
    training: bool,
    momentum: float | None,
    eps: float,
    *,
    keep_pre_norm: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """out = (y - mean) / sqrt(var + eps) * gamma + beta with y = (x W^T + b) * s, as nn.BatchNorm1d.

    Batch statistics are used when ``training or running_mean is None``; then running_mean/var (if
    given) are updated in place and ``num_batches_tracked`` (if given, and training) is incremented.
    Returns ``(out, pre_norm, save_mean, save_invstd)``: pre_norm is y when ``keep_pre_norm`` else an
    empty tensor; save_mean/save_invstd are the batch mean and 1/sqrt(var + eps) of y (float32, or
    float64 for float64 data), empty when the running statistics were used.
    """
    use_batch_stats = training or running_mean is None
    if use_batch_stats:
        check_batch_size(x.shape[0], weight.shape[0])  # before anything is mutated

    y = linear_scale(x, weight, bias, scale)
    pre_norm = y if keep_pre_norm else y.new_empty(0)
    stats_dtype = statistics_dtype(y.dtype)

    if not use_batch_stats:
        out = F.batch_norm(y, running_mean, running_var, gamma, beta, False, 0.0, eps)
        return out, pre_norm, y.new_empty(0, dtype=stats_dtype), y.new_empty(0, dtype=stats_dtype)

    # nn.BatchNorm1d's own kernel where it applies: the output, the statistics the backward keeps and the running
    # statistics' update in one pass over y (float32/float64 data, where it keeps the statistics in y's dtype; with
    # momentum None nn's factor is 1/num_batches_tracked, which the other branch computes on the device).
    one_pass = y.dtype == stats_dtype and (momentum is not None or num_batches_tracked is None)
    if one_pass:
        factor = 0.0 if momentum is None else momentum  # nn's factor when momentum is None and nothing is tracked
        out, mean, save_invstd = torch.native_batch_norm(y, gamma, beta, running_mean, running_var, True, factor, eps)
    else:
        # PyTorch's own batch_norm (the same ops as nn.BatchNorm1d) for the output; its argument checks (eps > 0)
        # fire before anything below moves.
        out = F.batch_norm(y, None, None, gamma, beta, True, 0.0, eps)
        with torch.no_grad():
            biased_var, mean = torch.var_mean(y.detach().to(stats_dtype), dim=0, correction=0)
            save_invstd = torch.rsqrt(biased_var + eps)
    with torch.no_grad():
        if training and num_batches_tracked is not None:
            num_batches_tracked.add_(1)  # before the update below, which reads it for momentum None
        if not one_pass and running_mean is not None and running_var is not None:
            _update_running_stats(
                running_mean, running_var, num_batches_tracked, momentum, mean, biased_var, x.shape[0]
            )
    return out, pre_norm, mean, save_invstd


class ReferenceModel(nn.Module):
    """KernelBench's Model: out = BatchNorm1d(Linear(x) * scale)."""

    def __init__(self, in_features, out_features, scale_shape, eps=1e-5, momentum=0.1):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scale = nn.Parameter(torch.randn(scale_shape))
        self.bn = nn.BatchNorm1d(out_features, eps=eps, momentum=momentum)

    def forward(self, x):
        x = self.gemm(x)
        x = x * self.scale
        x = self.bn(x)
        return x


def float64_forward(module: nn.Module, x: Tensor) -> tuple[Tensor, nn.BatchNorm1d]:
    """out64 = bn(gemm(x) * scale) in float64 on copies of module's gemm/scale/bn; returns (out64, bn copy).

    ``module`` is anything with ``gemm``, ``scale`` and ``bn`` attributes (ReferenceModel or
    GemmScaleBatchNorm). Call it before the module's own forward so both start from the same state;
    the returned bn holds the float64 running statistics after the step.
    """
    gemm = copy.deepcopy(module.gemm).double()
    bn = copy.deepcopy(module.bn).double()
    scale = module.scale.detach().double()
    with torch.no_grad():
        out = bn(gemm(x.detach().double()) * scale)
    return out, bn
