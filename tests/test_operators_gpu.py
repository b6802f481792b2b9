"""gemmbn's native operators (python/csrc/operators.cpp) on an sm90 GPU: torch.library.opcheck on each (schema,
fakes against the real outputs, AOT dispatch), launches on the caller's current stream (a side stream, a CUDA
graph), a refused call moving nothing, and the operators' outputs against the module's float64 reference."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import requires_sm90
from _helpers import assert_state_equal, make_pair, snapshot
from test_errors import BAD_INPUTS
from test_errors import K as BAD_K
from test_errors import N as BAD_N
from test_fallback import LAYOUTS, _vectors
from torch._inductor.utils import run_and_get_code

from _gpu import DEVICE, fused_path, poison_next_allocation, require_extension

from gemmbn import (GemmBnFallbackWarning, GemmScaleBatchNorm, _native, fallback, fused, fused_plan,
                    linear_scale_batch_norm, ops, reference)
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
    torch.library.opcheck(_op("eval_affine"), (*args[:8], 1e-5), test_utils=UTILS)
    affine = _op("eval_affine")(*args[:8], 1e-5)
    torch.library.opcheck(_op("eval_forward_folded"), (x, weight, affine, *args[11:13]), test_utils=UTILS)
    torch.library.opcheck(_op("linear_scale"), (x, weight, bias, None, *args[11:13]), test_utils=UTILS)
    torch.library.opcheck(_op("split_weight"), (weight,), test_utils=UTILS)
    torch.library.opcheck(_op("split_columns"), (x,), test_utils=UTILS)
    b_split = _op("split_columns")(x[:K].contiguous())
    torch.library.opcheck(_op("split_matmul"), (weight, *b_split), test_utils=UTILS)
    torch.library.opcheck(_op("transpose_padded"), (x[:, :K - 1].contiguous(),), test_utils=UTILS)
    torch.library.opcheck(_op("transpose_padded"), (x[:, :K - 1].contiguous(), True), test_utils=UTILS)
    weight_row_max = _op("transpose_padded")(weight, True)[1]
    torch.library.opcheck(_op("split_matmul"), (weight, *b_split, weight_row_max), test_utils=UTILS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("momentum", [0.1, None])
def test_opcheck_and_float64_of_the_synchronized_forwards_operators(dtype, momentum):
    """train_moments and normalize_from_moments (issue 19's two launches around the ranks' collective): opcheck on
    both; the moments against float64 of y as stored (rows exact, mean and M2 within
    the epilogue partials' fp32 merge); this batch split into three ranks' moments (one without rows) normalizing it
    as train_forward does with the whole batch (the same statistics within float32's rounding of the merge), the
    running statistics moved alike, num_batches_tracked read and not counted."""
    args = _train_arguments(dtype, keep_pre_norm=True, momentum=momentum)
    x, weight, bias, scale, gamma, beta, running_mean, running_var, counter = args[:9]
    torch.library.opcheck(_op("train_moments"), (x, weight, bias, scale, None, None), test_utils=UTILS)
    y, moments = _op("train_moments")(x, weight, bias, scale, None, None)
    y64 = y.double()
    assert torch.equal(moments[0], torch.full_like(moments[0], M))
    torch.testing.assert_close(moments[1].double(), y64.mean(0), rtol=1e-6, atol=1e-6 * y64.abs().max().item())
    torch.testing.assert_close(moments[2].double(), y64.var(0, correction=0) * M, rtol=1e-5, atol=0)
    parts = [_op("train_moments")(x[rows], weight, bias, scale, None, None)[1] for rows in (slice(0, 77), slice(77, M))]
    ranks = torch.stack([parts[0], torch.zeros_like(parts[0]), parts[1]])
    before = [t.clone() for t in (running_mean, running_var)]
    whole = _op("train_forward")(*args)  # the whole batch at once: moves running_mean/var and counts the batch
    counted = counter.clone()
    mine = [t.clone() for t in before]
    torch.library.opcheck(_op("normalize_from_moments"), (y, ranks, gamma, beta, mine[0].clone(), mine[1].clone(),
                          counter, momentum, 1e-5), test_utils=UTILS)  # fmt: skip
    out, mean, invstd = _op("normalize_from_moments")(y, ranks, gamma, beta, *mine, counter, momentum, 1e-5)
    assert torch.equal(counter, counted), "normalize_from_moments reads num_batches_tracked, never counts"
    limit = output_tolerance(dtype, "highest").limit  # y and the running statistics rounded once to dtype
    assert relative_error(out, whole[0]) <= limit
    torch.testing.assert_close(mean, whole[2], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(invstd, whole[3], rtol=1e-4, atol=0)
    for a, b in zip(mine, (running_mean, running_var)):
        assert relative_error(a, b) <= limit


# Bit 5 (dz transposed, with dz's maxima) is float32's: the other dtypes refuse it (tests/test_backward_gpu.py).
@pytest.mark.parametrize("dtype,outputs", [(dtype, outputs) for dtype in DTYPES for outputs in (0b11111, 0b10101, 0b00100)]
                         + [(torch.float32, 0b111111)], ids=str)  # fmt: skip
@pytest.mark.parametrize("batch_statistics", [True, False])
def test_opcheck_batch_norm_backward(dtype, outputs, batch_statistics):
    x, weight, bias, scale, gamma, beta = _train_arguments(dtype)[:6]
    y = torch.randn(M, N, dtype=dtype, device=DEVICE)
    mean, invstd = torch.randn(N, device=DEVICE), torch.rand(N, device=DEVICE) + 0.5
    args = (torch.randn(M, N, dtype=dtype, device=DEVICE), y, mean, invstd, gamma, scale, x, weight, bias,
            batch_statistics, outputs)  # fmt: skip
    torch.library.opcheck(_op("batch_norm_backward"), args, test_utils=UTILS)
    if batch_statistics:  # the two launches of statistics over ranks (issue 19)
        sums = _op("batch_norm_backward_sums")(*args[:4])
        torch.library.opcheck(_op("batch_norm_backward_sums"), args[:4], test_utils=UTILS)
        rows = torch.tensor([2.0 * M], dtype=torch.float64, device=DEVICE)
        torch.library.opcheck(_op("batch_norm_backward"), (*args, sums, sums[:2] * 2, rows), test_utils=UTILS)


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


def test_the_host_marks_fall_inside_the_call_in_order():
    """debug.host_mark_ns (perf/host_overhead.py --mark) reads Python's CLOCK_MONOTONIC: a call's three marks lie
    between its start and end in path order (operator entered, GEMM launching, GEMM enqueued) and move with every
    call; a refused call launches nothing, so the GEMM's marks stay where they were."""
    import time

    from gemmbn import debug

    args = _train_arguments(torch.bfloat16)
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        _op("train_forward")(*args)
        end = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        marks = [debug.host_mark_ns(mark) for mark in debug.HOST_MARKS]
        assert start <= marks[0] <= marks[1] <= marks[2] <= end, (start, marks, end)
    before = [debug.host_mark_ns(mark) for mark in debug.HOST_MARKS[1:]]
    with pytest.raises(RuntimeError, match="gemmbn:"):
        _op("train_forward")(args[0][:, :-1], *args[1:])  # K off by one against the weight: refused
    assert [debug.host_mark_ns(mark) for mark in debug.HOST_MARKS[1:]] == before


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


def _offset(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data pointer sits one element past a 16-byte boundary (a slice of a longer
    storage: what x[1:] of a bigger batch gives)."""
    storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = storage[1:].view(t.shape)
    view.copy_(t)
    return view


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t's values in a non-contiguous view (every other element of a storage twice as long)."""
    storage = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    view = storage[..., ::2]
    view.copy_(t)
    return view


@pytest.mark.parametrize("precision", ["highest", "high"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_read_operands_of_any_layout_take_the_fused_path(dtype, precision):
    """Offset, strided and transposed views of every operand the kernels only read (x, weight, bias, scale, gamma,
    beta; dout in the backward) run the kernels, no fallback, with the results of contiguous operands: bitwise for
    what gemmbn's kernels compute; dx and dW of the cuBLAS routes within a few fp32 roundings (cuBLAS picks its
    kernel, and so its summation order, by the operands' layout: a transposed weight runs another one)."""
    torch.manual_seed(0)
    x, weight = torch.randn(M, K, dtype=dtype, device=DEVICE), torch.randn(N, K, dtype=dtype, device=DEVICE) / K**0.5
    bias, scale, gamma, beta = (torch.randn(N, dtype=dtype, device=DEVICE) for _ in range(4))
    dout = torch.randn(M, N, dtype=dtype, device=DEVICE)
    views = {"x": _offset(x), "weight": weight.t().contiguous().t(), "bias": _strided(bias), "scale": _offset(scale),
             "gamma": _strided(gamma), "beta": _offset(beta)}  # fmt: skip
    assert not views["weight"].is_contiguous() and views["x"].data_ptr() % 16
    results = []
    for operands in ({"x": x, "weight": weight, "bias": bias, "scale": scale, "gamma": gamma, "beta": beta}, views):
        leaves = {name: t.detach().requires_grad_(True) for name, t in operands.items()}
        running = [torch.zeros(N, dtype=dtype, device=DEVICE), torch.ones(N, dtype=dtype, device=DEVICE)]
        counter = torch.tensor(0, device=DEVICE)
        with fused_path():
            out = linear_scale_batch_norm(leaves["x"], leaves["weight"], leaves["bias"], leaves["scale"],
                                          leaves["gamma"], leaves["beta"], *running, counter, True, 0.1, 1e-5,
                                          precision)  # fmt: skip
            out.backward(dout if operands is not views else _strided(dout))
        results.append({"out": out, "running_mean": running[0], "running_var": running[1],
                        **{name: leaves[name].grad for name in leaves}})  # fmt: skip
    own_gemms = dtype == torch.float32 and precision == "highest"  # the split GEMM: gemmbn's own, dx and dW too
    for name, contiguous in results[0].items():
        if name in ("x", "weight") and not own_gemms:
            # Sums of K or M <= 200 O(1) products in another fp32 order differ by up to ~200 * 2^-24 ~ 1e-5 (more,
            # relatively, where a sum cancels): 1e-4 is 10x that. bf16 gradients are rounded after it: one bf16 ulp
            # (at most 2^-7 relative).
            tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 1e-4}
            torch.testing.assert_close(results[1][name], contiguous, **tolerance, msg=lambda m, n=name: f"{n}: {m}")
        else:
            assert torch.equal(results[1][name], contiguous), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compiled_eval_calls_the_native_operator(dtype):
    """torch.compile of an eval model: the generated code calls gemmbn::eval_forward; output bitwise eager's."""
    torch.manual_seed(0)
    module = GemmScaleBatchNorm(K, N, (N,)).to(DEVICE, dtype).eval()
    module.bn.running_mean.uniform_(-1, 1)
    module.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(M, K, dtype=dtype, device=DEVICE)
    with torch.no_grad():
        expected = module(x)
        out, code = run_and_get_code(torch.compile(module, fullgraph=True), x)
    assert "gemmbn.eval_forward" in "\n".join(code) and "linear_scale_bn_eval" not in "\n".join(code)
    assert torch.equal(out, expected)


def test_a_compiled_module_follows_the_precision_switch():
    """precision=None follows torch's float32 matmul precision in a compiled graph too: switching it recompiles
    (dynamo guards the TF32 switch), and each setting gives the eager module's output bitwise."""
    torch.manual_seed(0)
    module = GemmScaleBatchNorm(K, N, (N,)).to(DEVICE)
    compiled = torch.compile(module, fullgraph=True)
    x = torch.randn(M, K, device=DEVICE)
    outputs = {}
    for setting in ("highest", "high", "highest"):
        with float32_matmul_precision(setting), torch.no_grad():
            expected = module(x)  # a training forward's output does not read the running statistics it moves
            actual = compiled(x)
        assert torch.equal(actual, expected), setting
        outputs[setting] = actual
    assert not torch.equal(outputs["highest"], outputs["high"])  # two GEMMs ran, not one


@pytest.mark.parametrize("bad", list(BAD_INPUTS))
def test_bad_input_to_a_cuda_module_raises_the_validated_routes_error(bad):
    """A module on the GPU calls the operator before any Python validation (functional.native_first): each bad
    input of test_errors still raises the validated route's error (type and message) and moves nothing."""
    make_x, error, match = BAD_INPUTS[bad]
    _, drop_in = make_pair(BAD_K, BAD_N, device=DEVICE)
    drop_in(torch.rand(8, BAD_K, device=DEVICE))  # non-trivial running statistics
    before = snapshot(drop_in)
    if bad == "x_on_other_device":
        x, match = torch.rand(8, BAD_K), "weight is on cuda:0 but x is on cpu"
    else:
        x = make_x().to(DEVICE)
    with pytest.raises(error, match=match):
        drop_in(x)
    assert_state_equal(drop_in, before)
