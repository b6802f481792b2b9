"""Batch statistics over every rank of a process group (nn.SyncBatchNorm's semantics), on the PyTorch route.

Forward with batch statistics: each rank's per-column (count, mean, M2) of y, all-gathered and merged in
rank order in float64 (the pairwise merge of Chan et al.), so every rank holds bitwise the same global mean
and biased variance. The running statistics move with the global mean and the unbiased variance over the
global count. Ranks may hold different numbers of rows, none included.
Backward: the normalization's two column sums (sum dout, sum dout xhat) are gathered and added in rank
order, so x's gradient is that of single-process training on the concatenated batch; gamma's and beta's are
the rank's own sums, which DDP then reduces across ranks, as with nn.SyncBatchNorm.
Eval mode communicates nothing. Collectives run through torch.distributed on the current stream, and the
forward reads no value back to the host.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .backward import grad_y_batch_statistics
from .reference import _update_running_stats, linear_scale, statistics_dtype


def _gather_in_rank_order(t: Tensor, process_group) -> list[Tensor]:
    """Every rank's t (same shape everywhere), indexed by rank."""
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size(process_group))]
    dist.all_gather(gathered, t.contiguous(), group=process_group)
    return gathered


def global_moments(y: Tensor, process_group) -> tuple[Tensor, Tensor, Tensor]:
    """(count, mean, biased variance) per column of y's rows on every rank, float64 [N] each."""
    local = y.detach().to(torch.float64)
    count = torch.full((y.shape[1],), float(y.shape[0]), dtype=torch.float64, device=y.device)
    mean = local.mean(0) if y.shape[0] else torch.zeros_like(count)
    m2 = ((local - mean) ** 2).sum(0)
    total_count, total_mean, total_m2 = (torch.zeros_like(count) for _ in range(3))
    for n, m, s in _gather_in_rank_order(torch.stack([count, mean, m2]), process_group):
        merged = total_count + n
        weight = torch.where(merged > 0, n / merged, torch.zeros_like(n))  # ranks without rows add nothing
        delta = m - total_mean
        total_m2 = total_m2 + s + delta * delta * total_count * weight
        total_mean = total_mean + delta * weight
        total_count = merged
    return total_count, total_mean, total_m2 / total_count


class _SynchronizedNormalization(torch.autograd.Function):
    """out = (y - mean) invstd gamma + beta with global statistics; the backward gathers its two column sums."""

    @staticmethod
    def forward(ctx, y, gamma, beta, mean, invstd, count, process_group):
        math = statistics_dtype(y.dtype)
        xhat = (y.to(math) - mean) * invstd
        out = xhat if gamma is None else xhat * gamma.to(math)
        out = out if beta is None else out + beta.to(math)
        ctx.save_for_backward(y, gamma, mean, invstd, count)
        ctx.process_group, ctx.has_beta = process_group, beta is not None
        return out.to(y.dtype)

    @staticmethod
    def backward(ctx, dout):
        y, gamma, mean, invstd, count = ctx.saved_tensors
        math = statistics_dtype(y.dtype)
        dout = dout.to(math)
        xhat = (y.to(math) - mean) * invstd
        local = torch.stack([dout.sum(0), (dout * xhat).sum(0)])
        total = torch.zeros_like(local)
        for sums in _gather_in_rank_order(local, ctx.process_group):  # rank order: the same on every rank
            total = total + sums
        a = invstd if gamma is None else invstd * gamma.to(math)
        grad_y = grad_y_batch_statistics(dout, xhat, a, total[0], total[1], count)
        dgamma = None if gamma is None else local[1].to(gamma.dtype)
        dbeta = local[0].to(y.dtype) if ctx.has_beta else None
        return grad_y.to(y.dtype), dgamma, dbeta, None, None, None, None


def forward_train(
    x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor, gamma: Tensor | None, beta: Tensor | None,
    running_mean: Tensor | None, running_var: Tensor | None, num_batches_tracked: Tensor | None,
    momentum: float | None, eps: float, process_group,
) -> Tensor:
    """linear_scale_batch_norm's batch-statistics forward with the statistics of every rank in process_group."""
    y = linear_scale(x, weight, bias, scale)
    count, mean, biased_var = global_moments(y, process_group)
    math = statistics_dtype(y.dtype)
    invstd = torch.rsqrt(biased_var + eps)
    with torch.no_grad():
        if num_batches_tracked is not None:
            num_batches_tracked.add_(1)
        if running_mean is not None and running_var is not None:
            _update_running_stats(running_mean, running_var, num_batches_tracked, momentum,
                                  mean.to(running_mean.dtype), biased_var.to(running_var.dtype), count)  # fmt: skip
    return _SynchronizedNormalization.apply(y, gamma, beta, mean.to(math), invstd.to(math), count.to(math),
                                            process_group)  # fmt: skip


def convert_sync_batchnorm(module: nn.Module, process_group=None) -> nn.Module:
    """nn.SyncBatchNorm.convert_sync_batchnorm's analogue: every GemmScaleBatchNorm in module (itself included)
    synchronizes its batch statistics over process_group (None: the default group), and every ReferenceModel
    becomes such a GemmScaleBatchNorm sharing its parameters and buffers. Returns the converted module."""
    from .modules import GemmScaleBatchNorm  # modules imports functional, which imports this file
    from .reference import ReferenceModel

    group = dist.group.WORLD if process_group is None else process_group
    if isinstance(module, ReferenceModel):
        module = GemmScaleBatchNorm.from_module(module)
    if isinstance(module, GemmScaleBatchNorm):
        module.process_group = group
        return module
    for name, child in module.named_children():
        setattr(module, name, convert_sync_batchnorm(child, process_group))
    return module
