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

import contextlib
import os

import torch
import torch.distributed as dist
from torch import Tensor, nn

from . import fused
from . import precision as precision_mod
from ._native import Refused, fused_unavailable_reason
from .backward import _fused_grads, _reference_grads, grad_y_batch_statistics
from .fallback import warn_once
from .reference import _update_running_stats, linear_scale, statistics_dtype

# The fused synchronized forward (train_moments, a collective, normalize_from_moments), an experiment run on one GPU,
# not yet on two (perf/NOTES.md v19): on with GEMMBN_SYNC_FUSED=1 in every rank's environment, read per call.
SYNC_FUSED = "GEMMBN_SYNC_FUSED"


def _gather_in_rank_order(t: Tensor, process_group) -> list[Tensor]:
    """Every rank's t (same shape everywhere), indexed by rank."""
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size(process_group))]
    dist.all_gather(gathered, t.contiguous(), group=process_group)
    return gathered


def _local_moments(y: Tensor) -> Tensor:
    """[3, N] float64: the rows, mean and M2 of y's columns (what every rank contributes, on either route)."""
    local = y.detach().to(torch.float64)
    count = torch.full((y.shape[1],), float(y.shape[0]), dtype=torch.float64, device=y.device)
    mean = local.mean(0) if y.shape[0] else torch.zeros_like(count)
    return torch.stack([count, mean, ((local - mean) ** 2).sum(0)])


def global_moments(y: Tensor, process_group) -> tuple[Tensor, Tensor, Tensor]:
    """(count, mean, biased variance) per column of y's rows on every rank, float64 [N] each."""
    return _merge_in_rank_order(_gather_in_rank_order(_local_moments(y), process_group))


def _merge_in_rank_order(gathered: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """(count, mean, biased variance) [N] of the ranks' [3, N] moments, merged in rank order in float64 (Chan et al.'s
    pairwise merge): every rank gets bitwise the same."""
    count = gathered[0][0].to(torch.float64)
    total_count, total_mean, total_m2 = (torch.zeros_like(count) for _ in range(3))
    for n, m, s in (g.to(torch.float64) for g in gathered):
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
        # Summed in float64 (as are the gathered moments): the sums' rounding is then the final cast's alone, as
        # eager's one-pass sums are close to (float32 sums of 1000 rows were 1.7x eager's error in dbeta).
        local = torch.stack([dout.sum(0, dtype=torch.float64), (dout * xhat).sum(0, dtype=torch.float64)])
        total = torch.zeros_like(local)
        for sums in _gather_in_rank_order(local, ctx.process_group):  # rank order: the same on every rank
            total = total + sums
        a = invstd if gamma is None else invstd * gamma.to(math)
        total = total.to(math)
        grad_y = grad_y_batch_statistics(dout, xhat, a, total[0], total[1], count)
        dgamma = None if gamma is None else local[1].to(gamma.dtype)
        dbeta = local[0].to(y.dtype) if ctx.has_beta else None
        return grad_y.to(y.dtype), dgamma, dbeta, None, None, None, None


class _FusedLinearScale(torch.autograd.Function):
    """(y, moments) = fused.train_moments: y = (x W^T + b) s on gemmbn's GEMM and this rank's [3, N] moments of y (not
    differentiable). The backward is y's: dx, dW, db and ds from dL/dy on the fused backward's launches."""

    @staticmethod
    def forward(ctx, x, weight, bias, scale, gemm_kind):
        y, moments = fused.train_moments(x, weight, bias, scale, gemm_kind)
        ctx.mark_non_differentiable(moments)
        ctx.save_for_backward(x, weight, bias, scale, y)
        ctx.gemm_kind = gemm_kind
        return y, moments

    @staticmethod
    def backward(ctx, grad_y, _):
        x, weight, bias, scale, y = ctx.saved_tensors
        # dL/dy is the normalization's gradient already (the gathered sums are in it): batch_norm_backward's
        # running-statistics form with mean 0, invstd 1 and no gamma passes it through as is (dz = s dL/dy, db, ds),
        # then the route's GEMMs, as the unsynchronized backward runs them. PyTorch's float32 GEMMs here took a bf16
        # step at 16384x4096->4096 to 26 ms (perf/NOTES.md v19).
        needs = [*ctx.needs_input_grad[:4], False, False]
        needs[2] = needs[2] and bias is not None
        zeros = torch.zeros(y.shape[1], dtype=torch.float32, device=y.device)
        try:
            grads = _fused_grads(ctx.gemm_kind, grad_y, x, weight, bias, scale, None, y, zeros, zeros + 1, False, needs)
        except Refused as refusal:  # the operators checked the layout before running anything: PyTorch ops
            warn_once(refusal.reason)
            grad = grad_y.to(statistics_dtype(y.dtype))
            explicit = {precision_mod.SPLIT_FP32: "highest", precision_mod.TF32: "high"}.get(ctx.gemm_kind)
            with precision_mod.float32_matmul_precision(explicit) if explicit else contextlib.nullcontext():
                grads = _reference_grads(grad, grad.sum(0), (grad * y.to(grad.dtype)).sum(0), x, weight, bias, scale,
                                         needs)  # fmt: skip
        return (*grads[:4], None)


class _SynchronizedFusedNormalization(_SynchronizedNormalization):
    """_SynchronizedNormalization whose forward is fused.normalize_from_moments: y normalized with the statistics of
    the ranks' gathered moments, the running statistics moved with them in the same launch. A rank without rows runs
    the same launch on a row of zeros, so that its running statistics are bitwise the other ranks'."""

    @staticmethod
    def forward(ctx, y, gamma, beta, rank_moments, count, process_group, running):
        rows = y if y.shape[0] else y.new_zeros((1, y.shape[1]))
        out, mean, invstd = fused.normalize_from_moments(rows, rank_moments, gamma, beta, *running)
        math = statistics_dtype(y.dtype)
        ctx.save_for_backward(y, gamma, mean.to(math), invstd.to(math), count)
        ctx.process_group, ctx.has_beta = process_group, beta is not None
        return out[: y.shape[0]]


def fused_route(x: Tensor) -> bool:
    """Whether the synchronized forward takes the fused launches (the SYNC_FUSED experiment on, x on a GPU they run
    on, eager: traced code keeps the PyTorch route)."""
    return (os.environ.get(SYNC_FUSED) == "1" and not torch.compiler.is_compiling()
            and fused_unavailable_reason(x) is None)  # fmt: skip


def _forward_train_fused(
    x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor, gamma: Tensor | None, beta: Tensor | None,
    running_mean: Tensor | None, running_var: Tensor | None, num_batches_tracked: Tensor | None,
    momentum: float | None, eps: float, process_group,
) -> Tensor:
    """forward_train on the fused launches: train_moments, the ranks' moments gathered in rank order (the PyTorch
    route's collective: [3, N] float64 each, so ranks on either route agree), normalize_from_moments. None if the
    first launch refused (nothing communicated yet: the caller takes the PyTorch route)."""
    gemm_kind = precision_mod.resolve(x.dtype, precision_mod.FOLLOW_TORCH)  # the caller set the layer's precision
    if x.shape[0]:
        try:
            y, moments = _FusedLinearScale.apply(x, weight, bias, scale, gemm_kind)
        except Refused as refusal:
            warn_once(refusal.reason)
            return None
        moments = moments.to(torch.float64)
    else:
        y = linear_scale(x, weight, bias, scale)
        moments = _local_moments(y)
    gathered = _gather_in_rank_order(moments, process_group)
    rank_moments = torch.stack(gathered)
    count = rank_moments[:, 0].sum(0)  # every rank's rows; exact in float64
    math = statistics_dtype(y.dtype)
    if num_batches_tracked is not None:
        with torch.no_grad():
            num_batches_tracked.add_(1)  # normalize_from_moments reads the count (momentum=None)
    running = (running_mean, running_var, num_batches_tracked, momentum, eps)
    try:
        return _SynchronizedFusedNormalization.apply(y, gamma, beta, rank_moments.float(), count.to(math),
                                                     process_group, running)  # fmt: skip
    except Refused as refusal:  # after the collective: the same statistics, merged in PyTorch
        warn_once(refusal.reason)
        count, mean, biased_var = _merge_in_rank_order(gathered)
        return _normalize_with(y, gamma, beta, count, mean, biased_var, running_mean, running_var,
                               num_batches_tracked, momentum, eps, process_group, count_batch=False)  # fmt: skip


def forward_train(
    x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor, gamma: Tensor | None, beta: Tensor | None,
    running_mean: Tensor | None, running_var: Tensor | None, num_batches_tracked: Tensor | None,
    momentum: float | None, eps: float, process_group,
) -> Tensor:
    """linear_scale_batch_norm's batch-statistics forward with the statistics of every rank in process_group: the
    fused launches where fused_route allows them, else the PyTorch route (saying why, once)."""
    if fused_route(x):
        out = _forward_train_fused(x, weight, bias, scale, gamma, beta, running_mean, running_var,
                                   num_batches_tracked, momentum, eps, process_group)  # fmt: skip
        if out is not None:
            return out
    else:
        warn_once(fused_unavailable_reason(x) or "batch statistics over a process group run on the PyTorch route "
                  f"(the fused launches are an experiment, on with {SYNC_FUSED}=1)")
    y = linear_scale(x, weight, bias, scale)
    count, mean, biased_var = global_moments(y, process_group)
    return _normalize_with(y, gamma, beta, count, mean, biased_var, running_mean, running_var, num_batches_tracked,
                           momentum, eps, process_group)  # fmt: skip


def _normalize_with(
    y: Tensor, gamma: Tensor | None, beta: Tensor | None, count: Tensor, mean: Tensor, biased_var: Tensor,
    running_mean: Tensor | None, running_var: Tensor | None, num_batches_tracked: Tensor | None,
    momentum: float | None, eps: float, process_group, count_batch: bool = True,
) -> Tensor:
    """The PyTorch route's normalization with the global statistics (float64 [N] each): the batch counted (when
    num_batches_tracked is given and the batch not counted yet), the running statistics moved, y normalized
    (_SynchronizedNormalization)."""
    math = statistics_dtype(y.dtype)
    invstd = torch.rsqrt(biased_var + eps)
    with torch.no_grad():
        if num_batches_tracked is not None and count_batch:
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
