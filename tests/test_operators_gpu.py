"""gemmbn's native operators (python/csrc/operators.cpp) on an sm90 GPU: torch.library.opcheck on each (schema,
fakes against the real outputs, AOT dispatch), launches on the caller's current stream (a side stream, a CUDA
graph), a refused call moving nothing, and the operators' outputs against the module's float64 reference."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import requires_sm90
from test_fallback import LAYOUTS, _vectors

from _gpu import DEVICE, poison_next_allocation, require_extension

from gemmbn import GemmBnFallbackWarning, _native, fallback, fused, fused_plan, ops, reference
from gemmbn.precision import float32_matmul_precision
from gemmbn.tolerances import output_tolerance, relative_error

pytestmark = [pytest.mark.gpu, requires_sm90]

M, K, N = 200, 96, 64  # M ragged against every row's tile; K and N 16-byte rows in every dtype
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# opcheck's autograd-registration test asks for an Autograd kernel: the operators have none of their own (ops.py's
# autograd.Functions call them), so it does not apply.
UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.fixture(scope="module", autouse=True)
def _built():
    require_extension()


def _op(name):
    return getattr(torch.ops.gemmbn, name).default


def _train_arguments(dtype, split=False, keep_pre_norm=True, momentum=0.1):
    torch.manual_seed(0)
    x, weight = torch.randn(M, K, dtype=dtype, device=DEVICE), torch.randn(N, K, dtype=dtype, device=DEVICE) / K**0.5
    bias, scale, gamma, beta, running_mean = (torch.randn(N, dtype=dtype, device=DEVICE) for _ in range(5))
    running_var = torch.rand(N, dtype=dtype, device=DEVICE) + 0.5
    counter = torch.tensor(3, device=DEVICE)
    weight_split, weight_unscale = _op("split_weight")(weight) if split else (None, None)
    return [x, weight, bias, scale, gamma, beta, running_mean, running_var, counter, momentum, 1e-5, weight_split,
            weight_unscale, keep_pre_norm]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("keep_pre_norm", [True, False])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_opcheck_train_forward(dtype, keep_pre_norm, momentum):
    args = _train_arguments(dtype, keep_pre_norm=keep_pre_norm, momentum=momentum)
    torch.library.opcheck(_op("train_forward"), args, test_utils=UTILS)


def test_opcheck_the_split_gemm_and_its_helpers():
    args = _train_arguments(torch.float32, split=True)
    torch.library.opcheck(_op("train_forward"), args, test_utils=UTILS)
    x, weight, bias, scale, gamma, beta, running_mean, running_var = args[:8]
    torch.library.opcheck(_op("eval_forward"), (*args[:8], 1e-5, *args[11:13]), test_utils=UTILS)
    torch.library.opcheck(_op("linear_scale"), (x, weight, bias, None, *args[11:13]), test_utils=UTILS)
    torch.library.opcheck(_op("split_weight"), (weight,), test_utils=UTILS)
    torch.library.opcheck(_op("transpose_padded"), (x[:, :K - 1].contiguous(),), test_utils=UTILS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("outputs", [0b11111, 0b10101, 0b00100])
@pytest.mark.parametrize("batch_statistics", [True, False])
def test_opcheck_batch_norm_backward(dtype, outputs, batch_statistics):
    x, weight, bias, scale, gamma, beta = _train_arguments(dtype)[:6]
    y = torch.randn(M, N, dtype=dtype, device=DEVICE)
    mean, invstd = torch.randn(N, device=DEVICE), torch.rand(N, device=DEVICE) + 0.5
    args = (torch.randn(M, N, dtype=dtype, device=DEVICE), y, mean, invstd, gamma, scale, x, weight, bias,
            batch_statistics, outputs)  # fmt: skip
    torch.library.opcheck(_op("batch_norm_backward"), args, test_utils=UTILS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_train_forward_matches_float64(dtype):
    """out and the saved statistics against float64 (output_tolerance: the GEMM's operand rounding in dtype), written
    over NaN poison."""
    args = _train_arguments(dtype, split=dtype == torch.float32)
    x, weight, bias, scale, gamma, beta = (t.double() for t in args[:6])
    y64 = (x @ weight.T + bias) * scale
    var64, mean64 = torch.var_mean(y64, dim=0, correction=0)
    expected = (y64 - mean64) * torch.rsqrt(var64 + 1e-5) * gamma + beta
    poison_next_allocation((M, N), dtype)
    out, y, mean, invstd = _op("train_forward")(*args)
    precision = "highest" if dtype == torch.float32 else None
    assert relative_error(out, expected) <= output_tolerance(dtype, precision).limit
    assert relative_error(y, y64) <= output_tolerance(dtype, precision).limit  # y rounded once to dtype
    # The saved statistics are those of y as stored (rounded to dtype), within dtype's rounding of the float64 ones.
    assert relative_error(mean, mean64) <= output_tolerance(dtype, precision).limit
    assert relative_error(invstd, torch.rsqrt(var64 + 1e-5)) <= output_tolerance(dtype, precision).limit


def test_a_side_stream_and_a_cuda_graph_get_the_launches():
    """The operators launch on torch's current stream: on a side stream the results equal the default stream's,
    and a CUDA graph captures them (a launch on another stream would fail the capture) and replays them."""
    args = _train_arguments(torch.bfloat16)
    first = _op("train_forward")(*args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        second = _op("train_forward")(*args)
    torch.cuda.current_stream().wait_stream(side)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        _op("train_forward")(*args)  # warm the caching allocator's pool on this stream before capture
        with torch.cuda.graph(graph, stream=side):
            captured = _op("train_forward")(*args)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(first, captured):
        assert torch.equal(a, b)


def test_a_refused_call_moves_nothing():
    args = _train_arguments(torch.float32)
    args[3] = args[3][: N - 1]  # scale one entry short
    running = [t.clone() for t in args[6:9]]
    with pytest.raises(RuntimeError, match=rf"gemmbn: scale must have shape \[{N}\], got \[{N - 1}\]"):
        _op("train_forward")(*args)
    torch.cuda.synchronize()
    for before, after in zip(running, args[6:9]):
        assert torch.equal(before, after)


def test_fused_train_forward_counts_the_buffer_updates():
    """fused.train_forward bumps the running buffers' version counters, as an in-place PyTorch update would."""
    args = _train_arguments(torch.float32)
    buffers = args[6:9]
    versions = [t._version for t in buffers]
    fused.train_forward(*args[:11], "tf32", True)
    assert all(t._version > v for t, v in zip(buffers, versions))


def test_the_library_is_the_one_loaded():
    assert _native.load_operators() is None


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name != "empty_batch"])
def test_the_operators_refuse_what_fused_plan_predicts_and_the_fallback_runs(layout):
    """gemmbn.fused_plan's verdict ahead of a call agrees with what the operator does: it runs the kernels where the
    plan says so, and refuses (before touching the running statistics) where the plan names a reason, after which
    the call falls back to the PyTorch reference, warning, with the reference's own result."""
    dtype, M, K_, N_, overrides, expected = LAYOUTS[layout]
    torch.manual_seed(0)
    x, weight = torch.randn(M, K_, device=DEVICE).to(dtype), torch.randn(N_, K_, device=DEVICE).to(dtype)
    vectors = {name: (t.to(DEVICE) if t.is_contiguous() else torch.randn(2 * N_, device=DEVICE)[::2])
               for name, t in _vectors(N_, dtype, **overrides).items()}  # fmt: skip
    counter = torch.tensor(0, device=DEVICE)
    plan = fused_plan(x, weight, vectors, 1e-5, counter)
    assert (plan is None) == (expected is None)
    before = {name: t.clone() for name, t in vectors.items()}
    reference_vectors = {name: t.clone() for name, t in vectors.items()}
    fallback.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GemmBnFallbackWarning)
        out = ops._train_impl(x, weight, vectors["bias"], vectors["scale"], vectors["gamma"], vectors["beta"],
                              vectors["running_mean"], vectors["running_var"], counter, 0.1, 1e-5, "high", False)[0]
    refusals = [str(w.message) for w in caught if issubclass(w.category, GemmBnFallbackWarning)]
    assert len(refusals) == (0 if plan is None else 1), refusals
    if plan is not None:  # the reference's result, running statistics included (the refusal moved nothing first)
        v = reference_vectors
        with float32_matmul_precision("high"):  # as the fallback runs it for precision="high"
            expected_out = reference.linear_scale_batch_norm(
                x, weight, v["bias"], v["scale"], v["gamma"], v["beta"], v["running_mean"], v["running_var"],
                torch.tensor(0, device=DEVICE), True, 0.1, 1e-5)[0]  # fmt: skip
        assert torch.equal(out, expected_out)
        for name in ("running_mean", "running_var"):
            assert torch.equal(vectors[name], v[name]), name
    else:
        assert not torch.equal(vectors["running_mean"], before["running_mean"])  # the kernels updated it
