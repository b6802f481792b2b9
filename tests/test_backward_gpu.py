"""The fused backward on an sm90 GPU: every gradient against float64 and eager PyTorch, determinism, CUDA
graphs of whole training steps, torch.compile, optimizer steps, no host synchronization.

Every step here runs inside ``fused_path()`` (a fallback warning fails the test), and the backward kernel's
calls are counted, so a test passes only where the fused backward really ran.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from _gpu import CONFIGS, DEVICE, fused_path, model, poison_next_allocation, rand_x, require_extension
from _helpers import cotangent, float64_grads, grads, reference_copy
from conftest import requires_sm90

from gemmbn import backward, fused
from gemmbn.precision import float32_matmul_precision
from gemmbn.tolerances import relative_error

pytestmark = [pytest.mark.gpu, requires_sm90]

# Ragged M (not a multiple of the 128-row tiles, and of 4: the split GEMM's dW pads M), N not a multiple of
# a 256-column stripe (16-bit N must stay a multiple of 8), and the benchmark shape.
SHAPES = {32: [(1001, 512, 260), (16384, 4096, 4096)], 16: [(1001, 512, 264), (16384, 4096, 4096)]}
# Eager PyTorch in the same precision: "highest" for fp32-highest and the 16-bit models, "high" (TF32) for TF32.
EAGER_PRECISION = {"fp32-highest": "highest", "fp32-high": "high", "bf16": "highest", "fp16": "highest"}
# Allowed ratio of gemmbn's error to eager's (both against float64). fp32 "highest" has the forward's
# contract: within 2x of eager fp32. TF32 and 16-bit run the same rounding steps as eager (operand
# roundings, fp32 accumulation, one output rounding), so the errors are two draws of the same noise;
# the 1.25 covers the spread between draws (issue 16 asks for <= eager's: the ratios measured are in
# perf/NOTES.md v12).
ERROR_RATIO = {"fp32-highest": 2.0, "fp32-high": 1.25, "bf16": 1.25, "fp16": 1.25}


@pytest.fixture(scope="module", autouse=True)
def _extension_built():
    require_extension()


@pytest.fixture
def backward_calls(monkeypatch):
    """A list that grows by one per call of the fused backward kernel (fused.batch_norm_backward)."""
    calls, kernel = [], fused.batch_norm_backward

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(fused, "batch_norm_backward", counted)
    return calls


def _cases():
    return [
        pytest.param(name, shape, id=f"{name}-{'x'.join(map(str, shape))}")
        for name, (dtype, _) in CONFIGS.items()
        for shape in SHAPES[dtype.itemsize * 8]
    ]


def _assert_within_eager(name, actual, eager, expected, what="", ratios=None):
    """Each gradient finite, of the parameter's dtype, and within ERROR_RATIO x eager's error against float64
    (``ratios``: other limits by gradient name)."""
    assert actual.keys() == expected.keys() == eager.keys()
    for key, grad64 in expected.items():
        grad = actual[key]
        assert grad.dtype == eager[key].dtype and torch.isfinite(grad).all(), f"{what}{key}"
        # ||error|| ratios, so gradients that are 0 in exact arithmetic (the bias's in training) compare
        # their rounding noise with eager's (the same denominator would cancel from a relative error).
        ours, theirs = (grad.double() - grad64).norm().item(), (eager[key].double() - grad64).norm().item()
        ratio = (ratios or {}).get(key, ERROR_RATIO[name])
        limit = ratio * theirs
        relative = relative_error(grad, grad64) if grad64.norm() > 0 else float("nan")
        assert ours <= limit, f"{what}{key}: ||error|| {ours:.3e} > {ratio} x eager's {theirs:.3e} " \
                              f"(relative {relative:.2e})"


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize(("name", "shape"), _cases())
def test_gradients_within_eager_error(name, shape, training, backward_calls):
    """Gradients of x, weight, bias, scale, gamma and beta against float64 autograd of the reference module,
    no worse than eager PyTorch's in the same precision (fp32 "highest": within 2x of eager fp32)."""
    _check_against_eager(name, shape, training, backward_calls)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_tf32_own_gemm_at_a_ragged_shape(training, backward_calls, monkeypatch):
    """The TF32 route's own GEMM (taken for large outputs only) at a ragged M, whose transposed operands are
    padded: forced here by dropping the size threshold."""
    monkeypatch.setattr(backward, "OWN_TF32_MIN_OUTPUT", 0)
    _check_against_eager("fp32-high", (1001, 512, 260), training, backward_calls)


def _check_against_eager(name, shape, training, backward_calls):
    dtype, precision = CONFIGS[name]
    M, K, N = shape
    drop_in = model(dtype, precision, K, N)
    eager = reference_copy(drop_in)
    drop_in.train(training), eager.train(training)
    if not training:  # eval normalizes with non-trivial running statistics
        with torch.no_grad():
            for m in (drop_in, eager):
                m.bn.running_mean.uniform_(-1, 1), m.bn.running_var.uniform_(0.5, 2)
    x = rand_x(M, K, dtype)
    expected = float64_grads(drop_in, x)
    with fused_path():
        actual = grads(drop_in, x)
    assert len(backward_calls) == 1
    with float32_matmul_precision(EAGER_PRECISION[name]):
        baseline = grads(eager, x)
    _assert_within_eager(name, actual, baseline, expected)


VARIANTS = {
    "affine_off": {"affine": False},
    "no_bias": {"bias": False},
    "tracking_off": {"track_running_stats": False},
    "scale_with_zeros": {},  # every third scale entry 0 (below)
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_gradients_of_module_variants(name, variant, backward_calls):
    """affine=False, bias=False, track_running_stats=False and a scale with zeros (there y = 0, so the scale's
    gradient needs z = x W^T + b, which the kernel makes from x and W for those columns: backward.py)."""
    dtype, precision = CONFIGS[name]
    M, K, N = 1001, 512, 264
    drop_in = model(dtype, precision, K, N, **VARIANTS[variant])
    if variant == "scale_with_zeros":
        with torch.no_grad():
            drop_in.scale[::3] = 0
    eager = reference_copy(drop_in)
    x = rand_x(M, K, dtype)
    expected = float64_grads(drop_in, x)
    with fused_path():
        actual = grads(drop_in, x)
    assert len(backward_calls) == 1
    if variant == "scale_with_zeros":
        assert actual["scale"][::3].abs().min() > 0, "zero scales still have a gradient (sum_m grad_y z)"
    with float32_matmul_precision(EAGER_PRECISION[name]):
        baseline = grads(eager, x)
    _assert_within_eager(name, actual, baseline, expected, f"{variant}: ")


# (parameters needing a gradient, "x" for the input; training): only the bias's (the kernel then writes no dz),
# only the scale's in eval (y was not kept, the backward makes it again), x's and the weight's (no dscale).
SUBSETS = {
    "bias_only-train": (("gemm.bias",), True),
    "scale_only-eval": (("scale",), False),
    "x_and_weight-train": (("x", "gemm.weight"), True),
}


@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_gradients_of_a_subset(name, subset, backward_calls):
    """Where only some inputs need a gradient, the backward returns those alone, bitwise equal to the ones of a
    backward of every input (checked against float64 above): skipping work changes no arithmetic."""
    dtype, precision = CONFIGS[name]
    wanted, training = SUBSETS[subset]
    drop_in = model(dtype, precision, 512, 264).train(training)
    with torch.no_grad():
        drop_in.bn.running_mean.uniform_(-1, 1), drop_in.bn.running_var.uniform_(0.5, 2)
    x = rand_x(1001, 512, dtype)
    with fused_path():
        every = grads(copy.deepcopy(drop_in), x)
        for key, p in drop_in.named_parameters():
            p.requires_grad_(key in wanted)
        x_in = x.clone().requires_grad_("x" in wanted)
        out = drop_in(x_in)
        out.backward(cotangent(out))
    assert len(backward_calls) == 2
    actual = {key: p.grad for key, p in drop_in.named_parameters()} | {"x": x_in.grad}
    for key, grad in actual.items():
        if key in wanted:
            assert torch.equal(grad, every[key]), key
        else:
            assert grad is None, key


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gradients_bitwise_deterministic(name):
    dtype, precision = CONFIGS[name]
    M, K, N = 1001, 512, 264
    first = model(dtype, precision, K, N)
    second = copy.deepcopy(first)
    x = rand_x(M, K, dtype)
    with fused_path():
        a, b = grads(first, x), grads(second, x)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _sgd_steps(module, xs, precision=None):
    """Five SGD-with-momentum steps on loss = sum(out * cotangent); the state (parameters and buffers) after.

    lr is small enough that no parameter moves by more than a few percent a step: with lr = 0.05 the scale
    (whose gradient is ~1e2 per entry here) changed sign within two steps and the trajectories of float64,
    eager and gemmbn parted chaotically, comparing nothing.
    """
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-4, momentum=0.9)
    with float32_matmul_precision(precision) if precision else fused_path():
        for x in xs:
            optimizer.zero_grad(set_to_none=True)
            out = module(x)
            out.backward(cotangent(out))
            optimizer.step()
    return {key: t.detach().double() for key, t in module.state_dict().items() if t.is_floating_point()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sgd_steps_track_eager(name):
    """After 5 SGD-with-momentum steps the parameters and running statistics are as close to float64 training
    as eager's are: each step's gradient errs like eager's (tests above), so the trajectories drift alike."""
    dtype, precision = CONFIGS[name]
    M, K, N = 1001, 512, 264
    drop_in = model(dtype, precision, K, N)
    eager, exact = reference_copy(drop_in), reference_copy(drop_in).double()
    xs = [rand_x(M, K, dtype) for _ in range(5)]
    ours = _sgd_steps(drop_in, xs)
    theirs = _sgd_steps(eager, xs, EAGER_PRECISION[name])
    expected = _sgd_steps(exact, [x.double() for x in xs], "highest")
    assert ours.keys() == expected.keys()
    for key, value in expected.items():
        error, eager_error = (ours[key] - value).norm().item(), (theirs[key] - value).norm().item()
        # The gradients' ratio, plus a floor of the state's own rounding to its dtype, 1 ulp a step.
        floor = 5 * torch.finfo(dtype).eps * value.norm().item()
        assert error <= ERROR_RATIO[name] * eager_error + floor, f"{key}: {error:.3e} vs eager {eager_error:.3e}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cuda_graph_of_training_steps(name, backward_calls):
    """Forward, backward and an SGD step captured in one CUDA graph replay bitwise like the same steps run eagerly."""
    dtype, precision = CONFIGS[name]
    M, K, N = 1001, 512, 264
    captured = model(dtype, precision, K, N, momentum=None)
    eager = copy.deepcopy(captured)
    static_x = rand_x(M, K, dtype)
    static_dout = torch.randn(M, N, device=DEVICE, dtype=dtype)

    def step(module, optimizer, x, dout):
        optimizer.zero_grad(set_to_none=False)
        module(x).backward(dout)
        optimizer.step()

    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, foreach=False) for m in (captured, eager)]
    with fused_path():
        # Warm up both on a side stream (allocator, cuBLAS handles, momentum buffers), one step each.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(captured, optimizers[0], static_x, static_dout)
            step(eager, optimizers[1], static_x.clone(), static_dout.clone())
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(captured, optimizers[0], static_x, static_dout)
        for replay in range(3):
            static_x.copy_(rand_x(M, K, dtype))
            static_dout.copy_(torch.randn(M, N, device=DEVICE, dtype=dtype))
            graph.replay()
            step(eager, optimizers[1], static_x.clone(), static_dout.clone())
            for (key, p), q in zip(captured.named_parameters(), eager.parameters()):
                assert torch.equal(p, q), f"replay {replay}: {key}"
    assert torch.equal(captured.bn.running_var, eager.bn.running_var)
    assert len(backward_calls) == 2 + 1 + 3  # warm-ups, the capture, the eager steps


# (config, torch's float32 matmul precision, whether the backward graph calls the native operators): a TF32 module
# under torch's "highest" keeps the backward in the Python operator (its cuBLAS GEMMs need the TF32 switch flipped,
# which a graph cannot do: backward.traced_natively).
COMPILED_STEPS = [("fp32-highest", "highest", True), ("fp32-high", "high", True), ("bf16", "highest", True),
                  ("fp32-high", "highest", False)]  # fmt: skip


@pytest.mark.parametrize(("name", "setting", "native_backward"), COMPILED_STEPS)
def test_compiled_training_step_calls_the_native_operators(name, setting, native_backward):
    """torch.compile(fullgraph=True) of the module: the code Inductor generates calls gemmbn's native operators
    (the forward and the backward kernel; the split weight for "highest"), not the Python operators that wrap the
    reference route, and outputs, running statistics and gradients equal the eager module's bitwise."""
    dtype, precision = CONFIGS[name]
    M, K, N = 1001, 512, 264
    eager = model(dtype, precision, K, N, momentum=None)
    compiled_module = copy.deepcopy(eager)
    compiled = torch.compile(compiled_module, fullgraph=True)
    x = rand_x(M, K, dtype)
    with fused_path(), float32_matmul_precision(setting):
        expected = grads(eager, x)
        actual, code = run_and_get_code(grads, compiled, x)
    code = "\n".join(code)
    native = ["gemmbn.train_forward"] + (["gemmbn.batch_norm_backward"] if native_backward else [])
    native += ["gemmbn.split_weight"] if name == "fp32-highest" else []
    for operator in native:
        assert operator in code, f"the compiled step does not call {operator}"
    assert "linear_scale_bn_train" not in code, "the compiled forward calls the Python operator"
    assert ("linear_scale_bn_backward" in code) != native_backward
    for key, grad in expected.items():
        torch.testing.assert_close(actual[key], grad, rtol=0, atol=0, msg=lambda m, key=key: f"{key}: {m}")
    for key in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(compiled_module.bn, key), getattr(eager.bn, key)), key


@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype feature")
@pytest.mark.parametrize("name", list(CONFIGS))
def test_backward_does_not_synchronize(name):
    dtype, precision = CONFIGS[name]
    drop_in = model(dtype, precision, 512, 264, momentum=None)
    x = rand_x(1001, 512, dtype)
    with fused_path():
        grads(drop_in, x)  # first call: imports, device queries, cuBLAS handles
        torch.cuda.synchronize()
        out = drop_in(x)
        dout = cotangent(out)
        torch.cuda.set_sync_debug_mode("error")
        try:
            out.backward(dout)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(p.grad).all() for p in drop_in.parameters())


@pytest.mark.parametrize("shape", [(1001, 260), (3, 4), (16384, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_transpose_padded_is_exact(shape):
    """The split GEMM's transposed operands (fp32 "highest" backward): every element moved as is, the padding
    columns zero, written over NaN poison."""
    R, C = shape
    t = torch.randn(R, C, device=DEVICE) * 10.0 ** torch.randint(-30, 31, (R, 1), device=DEVICE)
    poison_next_allocation((C, -(-R // 4) * 4))
    out = fused.transpose_padded(t)
    assert torch.equal(out[:, :R], t.t())
    assert torch.equal(out[:, R:], torch.zeros_like(out[:, R:]))
    # With the maxima (the split GEMM's row scales of t and of the transpose): the same transpose, and each row's
    # and column's largest magnitude bit for bit.
    poison_next_allocation((C, -(-R // 4) * 4))
    again, row_max, column_max = fused.transpose_with_maxima(t)
    assert torch.equal(again, out)
    assert torch.equal(row_max.view(torch.float32), t.abs().amax(1))
    assert torch.equal(column_max.view(torch.float32), t.abs().amax(0))


@pytest.mark.parametrize("shape", [(1001, 260), (2, 64), (300, 8192), (65536, 1024)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("batch_statistics", [True, False])
def test_batch_norm_backward_writes_dz_transposed(shape, batch_statistics):
    """The fp32 "highest" backward's dz^T and dz's row and column maxima from batch_norm_backward's own pass (bit 5):
    bit for bit transpose_with_maxima of its dz, the padding zero, written over NaN poison, and every other output
    the plain kernel's bit for bit. Zero-scale columns run phase 5 too. Other dtypes are refused."""
    M, N = shape
    K = 64
    g = torch.Generator(device=DEVICE).manual_seed(M + N)
    scale = torch.randn(N, device=DEVICE, generator=g)
    scale[::7] = 0
    y = (torch.randn(M, N, device=DEVICE, generator=g) * 3 + 1) * (scale != 0)  # y = z s: 0 where s is
    var, mean = torch.var_mean(y, 0, correction=0)
    args = (torch.randn(M, N, device=DEVICE, generator=g), y, mean, torch.rsqrt(var + 1e-5),
            torch.rand(N, device=DEVICE, generator=g) + 0.5, scale, torch.randn(M, K, device=DEVICE, generator=g),
            torch.randn(N, K, device=DEVICE, generator=g), torch.randn(N, device=DEVICE, generator=g),
            batch_statistics)  # fmt: skip
    op = torch.ops.gemmbn.batch_norm_backward.default
    plain = op(*args, 0b11111)
    poison_next_allocation((N, -(-M // 4) * 4))
    both = op(*args, 0b111111)
    for name, expected, got in zip(("dz", "dgamma", "dbeta", "dbias", "dscale"), plain[:5], both[:5]):
        assert torch.equal(got, expected), name
    for name, expected, got in zip(("dz_t", "row maxima", "column maxima"), fused.transpose_with_maxima(plain[0]),
                                   both[5:]):  # fmt: skip
        assert torch.equal(got, expected), name
    dout, y, mean, invstd, gamma, scale, x, weight, bias = args[:9]
    with pytest.raises(RuntimeError, match="dz transposed is float32's"):
        op(dout.bfloat16(), y.bfloat16(), mean, invstd, gamma.bfloat16(), scale.bfloat16(), x.bfloat16(),
           weight.bfloat16(), bias.bfloat16(), batch_statistics, 0b111111)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_batch_norm_backward_over_ranks_equals_the_whole_batch(dtype):
    """A synchronized backward's two launches (issue 19) on a batch split into three ranks' rows (600, 1 and 400: one
    rank with a single row): each rank's batch_norm_backward_sums against float64 (fp32 over a thread's 4 rows, then
    fp64: within 2^-20 of the sums of magnitudes), their first two rows added in rank order, each rank's gradients'
    launch from them. The ranks' dz, concatenated, is the whole batch's single launch's within 4 units of dtype's
    rounding (the same fp32 formula, coefficients from sums added in another order). Their [N] gradients, added up,
    are within 2x the whole launch's error against float64 plus dtype's rounding of each rank's part (a rank's dbias
    and dscale are not small: its share of sum grad_y does not cancel, the ranks' shares do). Zero-scale columns
    (phase 5) included; dz and the gradients written over NaN poison."""
    rows, N, K = (600, 1, 400), 264, 64
    M = sum(rows)
    g = torch.Generator(device=DEVICE).manual_seed(19)

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, generator=g)

    scale = randn(N).sign() * (torch.rand(N, device=DEVICE, generator=g) + 0.5)  # dscale ~ 1/s: no float16 overflow
    scale[::7] = 0
    x, weight, bias = randn(M, K).to(dtype), randn(N, K).to(dtype), randn(N).to(dtype)
    z = x.double() @ weight.double().T + bias.double()
    y = ((z * scale.double()).to(dtype))  # y = z s as stored: 0 where s is
    var, mean = torch.var_mean(y.float(), 0, correction=0)
    invstd = torch.rsqrt(var + 1e-5)
    # dL/dout small: a zero-scale column's invstd is 1/sqrt(eps), and its dscale (~1e5 at unit dout) overflows float16.
    dout = (randn(M, N) / 64).to(dtype)
    gamma, scale = (torch.rand(N, device=DEVICE, generator=g) + 0.5).to(dtype), scale.to(dtype)
    op, sums_op = torch.ops.gemmbn.batch_norm_backward.default, torch.ops.gemmbn.batch_norm_backward_sums.default
    whole = op(dout, y, mean, invstd, gamma, scale, x, weight, bias, True, 0b11111)
    parts = [slice(sum(rows[:r]), sum(rows[: r + 1])) for r in range(len(rows))]
    local = [sums_op(dout[p], y[p], mean, invstd) for p in parts]
    for p, sums in zip(parts, local):
        d = y[p].double() - mean.double()
        terms = torch.stack([dout[p].double(), dout[p].double() * d, d])
        assert ((sums - terms.sum(1)).abs() <= 2.0**-20 * terms.abs().sum(1) + 1e-300).all()
    total = torch.zeros_like(local[0][:2])  # the ranks' sums of dout and dout d (sum d stays each rank's)
    for sums in local:
        total = total + sums[:2]
    global_rows = torch.tensor([float(M)], dtype=torch.float64, device=DEVICE)
    ranks = []
    for count, p, sums in zip(rows, parts, local):
        poison_next_allocation((count, N), dtype)  # dz
        ranks.append(op(dout[p], y[p], mean, invstd, gamma, scale, x[p], weight, bias, True, 0b11111, sums, total,
                        global_rows))  # fmt: skip
    u = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    assert relative_error(torch.cat([r[0] for r in ranks]), whole[0]) <= 4 * u
    # float64 of api.h's math with the given statistics; z where s = 0 from x and the weight, else y / s.
    d, istd, a = y.double() - mean.double(), invstd.double(), gamma.double() * invstd.double()
    s64 = scale.double()
    S0, S1 = dout.double().sum(0), (dout.double() * d).sum(0)
    grad_y = a * (dout.double() - S0 / M - d * istd * istd * S1 / M)
    z = torch.where(s64 != 0, y.double() / torch.where(s64 != 0, s64, 1), z)
    expected = {"dgamma": istd * S1, "dbeta": S0, "dbias": s64 * grad_y.sum(0), "dscale": (grad_y * z).sum(0)}
    for i, (name, exact) in enumerate(expected.items(), start=1):
        ours = (sum(r[i].double() for r in ranks) - exact).norm()
        theirs = (whole[i].double() - exact).norm()
        roundings = sum((u * r[i].double().abs()).norm() for r in ranks)
        assert ours <= 2 * theirs + roundings + 1e-12 * exact.norm(), f"{name}: {ours:.3e} vs whole {theirs:.3e}"
    with pytest.raises(RuntimeError, match="come together"):
        op(dout, y, mean, invstd, gamma, scale, x, weight, bias, True, 0b11111, local[0], total, None)
