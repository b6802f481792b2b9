"""Fake (meta) implementations of the native operators (python/csrc/operators.cpp): the shapes and dtypes of
their outputs, so that torch.compile, torch.export and torch.library.opcheck can trace them without running them.

Registered by _native.load_operators once the library has defined the operators.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .reference import statistics_dtype


def _train_forward(x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked, momentum,
                   eps, weight_split, weight_unscale, keep_pre_norm):  # fmt: skip
    M, N = x.shape[0], weight.shape[0]
    out = x.new_empty((M, N))
    pre_norm = x.new_empty((M, N) if keep_pre_norm else (0,))
    stats = statistics_dtype(x.dtype)
    return out, pre_norm, x.new_empty(N, dtype=stats), x.new_empty(N, dtype=stats)


def _eval_forward(x, weight, bias, scale, gamma, beta, running_mean, running_var, eps, weight_split, weight_unscale):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _eval_affine(x, weight, bias, scale, gamma, beta, running_mean, running_var, eps):
    return x.new_empty((2, weight.shape[0]), dtype=torch.float32)


def _eval_forward_folded(x, weight, affine, weight_split, weight_unscale):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _linear_scale(x, weight, bias, scale, weight_split, weight_unscale):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _train_moments(x, weight, bias, scale, weight_split, weight_unscale):
    M, N = x.shape[0], weight.shape[0]
    return x.new_empty((M, N)), x.new_empty((3, N), dtype=torch.float32)


def _normalize_from_moments(y, rank_moments, gamma, beta, running_mean, running_var, num_batches_tracked, momentum,
                            eps):  # fmt: skip
    N = y.shape[1]
    return y.new_empty(y.shape), y.new_empty(N, dtype=torch.float32), y.new_empty(N, dtype=torch.float32)


def _split_weight(weight: Tensor):
    N, K = weight.shape
    columns = -(-K // 32) * 64  # api.h's split_weight_columns: hi and lo of every 32-column slice, zero-padded
    return weight.new_empty((N, columns), dtype=torch.float16), weight.new_empty(N, dtype=torch.float32)


def _split_columns(t: Tensor):
    return _split_weight(t.t())  # the split of t^T


def _split_matmul(a: Tensor, b_split: Tensor, b_unscale: Tensor, a_row_max: Tensor | None = None):
    return a.new_empty((a.shape[0], b_unscale.shape[0]))


def _transpose_padded(input: Tensor, maxima: bool = False):
    R, C = input.shape
    maxima_shapes = ((R,), (C,)) if maxima else ((0,), (0,))
    return input.new_empty((C, -(-R // 4) * 4)), *(input.new_empty(s, dtype=torch.int32) for s in maxima_shapes)


def _batch_norm_backward(dout, y, mean, invstd, gamma, scale, x, weight, bias, batch_statistics, outputs,
                         local_sums=None, global_sums=None, global_rows=None):  # fmt: skip
    M, N = dout.shape
    shapes = ((M, N), (N,), (N,), (N,), (N,))  # dz, dgamma, dbeta, dbias, dscale
    grads = tuple(dout.new_empty(shape if outputs >> i & 1 else (0,)) for i, shape in enumerate(shapes))
    if outputs >> 5 & 1:  # dz transposed, with dz's maxima: transpose_padded(dz, maxima=True)'s outputs
        return grads + _transpose_padded(grads[0], True)
    return grads + (dout.new_empty(0, dtype=torch.float32), *(dout.new_empty(0, dtype=torch.int32) for _ in range(2)))


def _batch_norm_backward_sums(dout, y, mean, invstd):
    return dout.new_empty((3, dout.shape[1]), dtype=torch.float64)


_FAKES = {
    "train_forward": _train_forward,
    "eval_forward": _eval_forward,
    "eval_affine": _eval_affine,
    "eval_forward_folded": _eval_forward_folded,
    "linear_scale": _linear_scale,
    "train_moments": _train_moments,
    "normalize_from_moments": _normalize_from_moments,
    "split_weight": _split_weight,
    "split_columns": _split_columns,
    "split_matmul": _split_matmul,
    "transpose_padded": _transpose_padded,
    "batch_norm_backward": _batch_norm_backward,
    "batch_norm_backward_sums": _batch_norm_backward_sums,
}


def register() -> None:
    for name, fake in _FAKES.items():
        torch.library.register_fake(f"gemmbn::{name}", fake)
