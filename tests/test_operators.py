"""gemmbn's native operators (python/csrc/operators.cpp) without a GPU: the stable-ABI library loads into this
torch, registers every operator with its schema (mutated arguments annotated), refuses CPU tensors by name
before touching anything, and its fakes give the shapes and dtypes the GPU operators return."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gemmbn import _native

M, K, N = 48, 100, 24


@pytest.fixture(scope="module", autouse=True)
def _operators_loaded():
    reason = _native.load_operators()
    if reason is not None and "is missing" in reason:
        pytest.skip(f"nothing is built here ({reason})")
    assert reason is None, reason  # built but not loadable: a defect, not a skip


def _op(name):
    return getattr(torch.ops.gemmbn, name).default


def test_every_operator_is_registered_and_only_the_running_buffers_are_mutated():
    for name in _native.OPERATOR_NAMES:
        schema = _op(name)._schema
        written = {arg.name for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write}
        expected = {"train_forward": {"running_mean", "running_var", "num_batches_tracked"},
                    # the synchronized forward's second launch: the caller counts the batch (distributed.py)
                    "normalize_from_moments": {"running_mean", "running_var"}}.get(name, set())  # fmt: skip
        assert written == expected, (name, written)


def _train_arguments(device="cpu", dtype=torch.float32, keep_pre_norm=True):
    vector = lambda: torch.randn(N, dtype=dtype, device=device)  # noqa: E731
    return [torch.randn(M, K, dtype=dtype, device=device), torch.randn(N, K, dtype=dtype, device=device), vector(),
            vector(), vector(), vector(), vector(), torch.rand(N, dtype=dtype, device=device) + 0.5,
            torch.zeros((), dtype=torch.int64, device=device), 0.1, 1e-5, None, None, keep_pre_norm]  # fmt: skip


def test_cpu_tensors_are_refused_by_name_and_nothing_moves():
    args = _train_arguments()
    running = [t.clone() for t in args[6:9]]
    with pytest.raises(RuntimeError, match="gemmbn: x must be a CUDA tensor"):
        _op("train_forward")(*args)
    for before, after in zip(running, args[6:9]):
        assert torch.equal(before, after)
    dout = torch.randn(M, N)
    with pytest.raises(RuntimeError, match="gemmbn: dout must be a CUDA tensor"):
        _op("batch_norm_backward")(dout, None, torch.zeros(N), torch.ones(N), None, torch.ones(N),
                                   torch.randn(M, K), torch.randn(N, K), None, True, 31)  # fmt: skip
    with pytest.raises(RuntimeError, match="gemmbn: x must be a CUDA tensor"):
        _op("train_moments")(*args[:4], None, None)
    with pytest.raises(RuntimeError, match="gemmbn: y must be a CUDA tensor"):
        _op("normalize_from_moments")(torch.randn(M, N), torch.zeros(2, 3, N), *args[4:9], 0.1, 1e-5)
    for before, after in zip(running, args[6:9]):
        assert torch.equal(before, after)
    with pytest.raises(RuntimeError, match="gemmbn: x must be a CUDA tensor"):
        _op("eval_affine")(*args[:8], 1e-5)
    with pytest.raises(RuntimeError, match="gemmbn: x must be a CUDA tensor"):
        _op("eval_forward_folded")(args[0], args[1], torch.zeros(2, N), None, None)
    with pytest.raises(RuntimeError, match="gemmbn: weight must be a CUDA tensor"):
        _op("split_weight")(torch.randn(N, K))
    with pytest.raises(RuntimeError, match="gemmbn: t must be a CUDA tensor"):
        _op("split_columns")(torch.randn(K, N))
    with pytest.raises(RuntimeError, match="gemmbn: a must be a CUDA tensor"):
        _op("split_matmul")(torch.randn(M, K), torch.randn(N, 256).half(), torch.randn(N))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fakes_give_the_output_shapes(dtype):
    with FakeTensorMode():
        for keep in (True, False):
            out, pre_norm, mean, invstd = _op("train_forward")(*_train_arguments(dtype=dtype, keep_pre_norm=keep))
            assert (out.shape, out.dtype, pre_norm.shape) == ((M, N), dtype, (M, N) if keep else (0,))
            assert (mean.shape, mean.dtype, invstd.shape, invstd.dtype) == ((N,), torch.float32, (N,), torch.float32)
        args = _train_arguments(dtype=dtype)
        evaluated = _op("eval_forward")(*args[:6], args[6], args[7], 1e-5, None, None)
        assert (evaluated.shape, evaluated.dtype) == ((M, N), dtype)
        affine = _op("eval_affine")(*args[:6], args[6], args[7], 1e-5)
        assert (affine.shape, affine.dtype) == ((2, N), torch.float32)
        folded = _op("eval_forward_folded")(args[0], args[1], affine, None, None)
        assert (folded.shape, folded.dtype) == ((M, N), dtype)
        assert _op("linear_scale")(args[0], args[1], None, None, None, None).shape == (M, N)
        y, moments = _op("train_moments")(*args[:4], None, None)
        assert (y.shape, y.dtype, moments.shape, moments.dtype) == ((M, N), dtype, (3, N), torch.float32)
        out, mean, invstd = _op("normalize_from_moments")(y, torch.zeros(2, 3, N), *args[4:9], None, 1e-5)
        assert (out.shape, out.dtype, mean.shape, mean.dtype, invstd.shape) == ((M, N), dtype, (N,), torch.float32, (N,))
        dz, dgamma, dbeta, dbias, dscale, dz_t, dz_row_max, dz_column_max = _op("batch_norm_backward")(
            torch.randn(M, N, dtype=dtype), None, torch.zeros(N), torch.ones(N), None, args[3], args[0], args[1],
            None, False, 0b00101,
        )  # fmt: skip
        grads = (dz, dgamma, dbeta, dbias, dscale, dz_t, dz_row_max, dz_column_max)
        assert [t.shape for t in grads] == [(M, N), (0,), (N,), (0,), (0,), (0,), (0,), (0,)]
        assert dz.dtype == dtype
        if dtype == torch.float32:  # dz transposed (bit 5), as transpose_padded(dz, maxima=True) gives it
            *_, dz_t, dz_row_max, dz_column_max = _op("batch_norm_backward")(
                torch.randn(M + 1, N), None, torch.zeros(N), torch.ones(N), None, args[3], torch.randn(M + 1, K),
                args[1], None, False, 0b100001,
            )  # fmt: skip
            assert (dz_t.shape, dz_t.dtype) == ((N, M + 4), torch.float32)
            assert (dz_row_max.shape, dz_row_max.dtype, dz_column_max.shape) == ((M + 1,), torch.int32, (N,))
    with FakeTensorMode():
        weight_split, weight_unscale = _op("split_weight")(torch.randn(N, K))
        # K = 100 -> 4 slices of 32 columns, each as an fp16 hi and lo half (api.h's split_weight_columns).
        assert (weight_split.shape, weight_split.dtype, weight_unscale.shape) == ((N, 256), torch.float16, (N,))
        transposed, row_max, column_max = _op("transpose_padded")(torch.randn(M + 1, K))
        assert (transposed.shape, row_max.shape, column_max.shape) == ((K, M + 4), (0,), (0,))
        _, row_max, column_max = _op("transpose_padded")(torch.randn(M + 1, K), True)
        assert (row_max.shape, row_max.dtype, column_max.shape) == ((M + 1,), torch.int32, (K,))
        split, unscale = _op("split_columns")(torch.randn(K, N))  # the split of the [N, K] transpose
        assert (split.shape, split.dtype, unscale.shape) == ((N, 256), torch.float16, (N,))
        assert _op("split_matmul")(torch.randn(M, K), split, unscale).shape == (M, N)


def test_torch_older_than_2_10_is_refused_with_the_reason(monkeypatch):
    """The stable ABI the library is built on starts at torch 2.10: an older torch gets the reference path, and the
    fallback reason says why (load_operators is cached per process, so its uncached body is asked here)."""
    monkeypatch.setattr(_native, "_torch_version", lambda: (2, 9))
    reason = _native.load_operators.__wrapped__()
    assert reason is not None and "older than 2.10" in reason
