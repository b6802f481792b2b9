"""The native kernels (gemmbn._C) against float64 references, without the Python layer on top.

Outputs and workspaces are poisoned with NaN before each launch, so an element a kernel fails to
write shows up as NaN. Skipped where there is no sm90 GPU or no built extension.
"""

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

_C = pytest.importorskip("gemmbn._C", reason="the native extension is not built")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm90 (Hopper) GPU", allow_module_level=True)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Relative Frobenius error of y = (x W^T + b) s against float64, K <= 4096:
# TF32 rounds operands to 10 mantissa bits (unit roundoff 2^-11 ~ 4.9e-4) -> ~5e-4 typical;
# bf16 operands and output have 8 bits (2^-8 ~ 3.9e-3); fp16 operands and output 11 bits.
GEMM_TOL = {"float32": 2e-3, "bfloat16": 1.5e-2, "float16": 2e-3}


def _stream():
    return torch.cuda.current_stream().cuda_stream


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _problem(M, K, N, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(M, K, device="cuda", generator=g).to(dtype)
    w = ((torch.rand(N, K, device="cuda", generator=g) * 2 - 1) / math.sqrt(K)).to(dtype)
    b = (torch.rand(N, device="cuda", generator=g) - 0.5).to(dtype)
    s = torch.randn(N, device="cuda", generator=g).to(dtype)
    return x, w, b, s


def _gemm(x, w, b, s, dtype_name, stats=True, counter=None, config=-1, raster=-1, swizzle=-1):
    M, N, K = x.shape[0], w.shape[0], x.shape[1]
    tile_m, _ = _C.gemm_config(dtype_name, M, N, K, config)
    tiles = -(-M // tile_m)
    y = torch.full((M, N), float("nan"), device="cuda", dtype=x.dtype)
    pm = torch.full((tiles, N), float("nan"), device="cuda") if stats else None
    pm2 = torch.full((tiles, N), float("nan"), device="cuda") if stats else None
    _C.gemm_scale_stats(x, w, y, b, s, None, None, pm, pm2, counter, _stream(), config=config, raster=raster,
                        swizzle=swizzle)
    return y, pm, pm2, tile_m


def _tile_moments(acc64, tile_m):
    means, m2s = [], []
    for start in range(0, acc64.shape[0], tile_m):
        tile = acc64[start:start + tile_m]
        mean = tile.mean(0)
        means.append(mean)
        m2s.append(((tile - mean) ** 2).sum(0))
    return torch.stack(means), torch.stack(m2s)


SHAPES = [(1000, 512, 264), (2, 64, 64), (129, 256, 520), (300, 1024, 1032)]


def _check_gemm_and_partials(x, w, b, s, dtype_name, **launch):
    """One gemm_scale_stats launch (launch: config/raster/swizzle overrides) against float64."""
    y, pm, pm2, tile_m = _gemm(x, w, b, s, dtype_name, **launch)
    torch.cuda.synchronize()
    y_ref = (x.double() @ w.double().T + b.double()) * s.double()
    assert not y.isnan().any(), "unwritten output elements"
    assert _rel(y, y_ref) < GEMM_TOL[dtype_name]
    assert not pm.isnan().any() and not pm2.isnan().any(), "unwritten partials"
    # The partials describe y as stored: against float64 statistics of the kernel's own y, only the
    # reduction errs (fp32 per-thread two-pass moments and Chan merges over <= 128 rows: a few ulp).
    mean_ref, m2_ref = _tile_moments(y.double(), tile_m)
    assert _rel(pm, mean_ref) < 1e-5
    assert _rel(pm2, m2_ref) < 1e-5


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_gemm_output_and_partials(dtype_name, M, K, N):
    _check_gemm_and_partials(*_problem(M, K, N, DTYPES[dtype_name]), dtype_name)


# Every row of every configuration table (select_config may pick any of them for some shape), under
# the default and two other tile orders: M = 1000 has 7 full M-tiles and a ragged one, N = 264 a ragged
# N-tile, so both reductions of the statistics node and the bounds of the stores are exercised.
CONFIG_ROWS = [(name, row) for name in DTYPES for row in range(len(_C.gemm_configs(name)))]


@pytest.mark.parametrize("dtype_name,row", CONFIG_ROWS)
@pytest.mark.parametrize("raster,swizzle", [(-1, -1), (1, 2), (2, 8)])
def test_every_configuration_row(dtype_name, row, raster, swizzle):
    problem = _problem(1000, 512, 264, DTYPES[dtype_name], seed=row)
    _check_gemm_and_partials(*problem, dtype_name, config=row, raster=raster, swizzle=swizzle)


def test_configuration_overrides_are_checked():
    x, w, b, s = _problem(256, 64, 64, torch.float32)
    y = torch.empty(256, 64, device="cuda")
    rows = len(_C.gemm_configs("float32"))
    for kwargs, message in (({"config": rows}, "config"), ({"raster": 3}, "raster"), ({"swizzle": 3}, "swizzle")):
        with pytest.raises(ValueError, match=message):
            _C.gemm_scale_stats(x, w, y, b, s, None, None, None, None, None, _stream(), **kwargs)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_partials_survive_a_large_mean(dtype_name):
    # Every row is ~1.03 + a small variation, so each column's mean is ~100x its std: a raw fp32
    # sum-of-squares formula would lose ~1e-3 of the variance; the shifted, Chan-merged reduction keeps
    # it to a few ulp of the statistics of y as stored.
    dtype = DTYPES[dtype_name]
    M, K, N = 512, 256, 256
    g = torch.Generator(device="cuda").manual_seed(5)
    x = (1 + torch.randint(0, 8, (M, K), device="cuda", generator=g) / 128).to(dtype)
    w = (torch.randint(-8, 9, (N, K), device="cuda", generator=g) / 64).to(dtype)
    b, s = torch.zeros(N, device="cuda", dtype=dtype) + 0.25, torch.ones(N, device="cuda", dtype=dtype)
    y, pm, pm2, tile_m = _gemm(x, w, b, s, dtype_name)
    mean_ref, m2_ref = _tile_moments(y.double(), tile_m)
    assert (mean_ref.abs() / (m2_ref / tile_m).sqrt()).median() > 20, "the test needs mean >> std"
    assert _rel(pm, mean_ref) < 1e-6
    assert _rel(pm2, m2_ref) < 1e-5


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("momentum", [0.1, None])
def test_training_pipeline(dtype_name, momentum):
    dtype = DTYPES[dtype_name]
    M, K, N = 1000, 512, 264
    x, w, b, s = _problem(M, K, N, dtype, seed=1)
    gamma = (torch.rand(N, device="cuda") + 0.5).to(dtype)
    beta = torch.randn(N, device="cuda").to(dtype)
    running_mean = torch.randn(N, device="cuda").to(dtype)
    running_var = (torch.rand(N, device="cuda") + 0.5).to(dtype)
    rm0, rv0 = running_mean.double().clone(), running_var.double().clone()
    counter = torch.tensor([4], device="cuda", dtype=torch.int64)
    y, pm, pm2, tile_m = _gemm(x, w, b, s, dtype_name, counter=counter)
    out = torch.full_like(y, float("nan"))
    save_mean = torch.full((N,), float("nan"), device="cuda")
    save_invstd = torch.full((N,), float("nan"), device="cuda")
    _C.finish_normalize(y, out, pm, pm2, tile_m, gamma, beta, running_mean, running_var, counter,
                        momentum, 1e-5, save_mean, save_invstd, _stream())
    torch.cuda.synchronize()
    assert counter.item() == 5, "the GEMM increments num_batches_tracked exactly once"

    # Reference: BatchNorm in float64 of y as the kernel stored it (PyTorch's BatchNorm, too, sees its
    # input after rounding to dtype); y itself is checked against float64 in the test above.
    y64 = y.double()
    mean64, var64 = y64.mean(0), y64.var(0, unbiased=False)
    out64 = (y64 - mean64) / torch.sqrt(var64 + 1e-5) * gamma.double() + beta.double()
    assert not out.isnan().any()
    # Statistics exact to a few fp32 ulp; the output is rounded once to dtype (2^-9 bf16, 2^-12 fp16).
    out_tol = {"float32": 1e-5, "bfloat16": 4e-3, "float16": 5e-4}[dtype_name]
    assert _rel(out, out64) < out_tol
    assert _rel(save_mean, mean64) < 1e-5
    assert _rel(save_invstd, 1 / torch.sqrt(var64 + 1e-5)) < 1e-5
    f = 1 / 5 if momentum is None else momentum
    rm_ref = (1 - f) * rm0 + f * mean64
    rv_ref = (1 - f) * rv0 + f * var64 * M / (M - 1)
    # Running statistics are stored in dtype: its rounding bounds the error.
    stat_tol = {"float32": 1e-5, "bfloat16": 4e-3, "float16": 5e-4}[dtype_name]
    assert _rel(running_mean, rm_ref) < stat_tol
    assert _rel(running_var, rv_ref) < stat_tol


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_deterministic(dtype_name):
    dtype = DTYPES[dtype_name]
    x, w, b, s = _problem(1000, 512, 264, dtype, seed=2)
    first = _gemm(x, w, b, s, dtype_name)
    second = _gemm(x, w, b, s, dtype_name)
    for a, c in zip(first[:3], second[:3]):
        assert torch.equal(a, c)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_eval_folded_affine(dtype_name):
    dtype = DTYPES[dtype_name]
    M, K, N = 333, 256, 264
    x, w, b, s = _problem(M, K, N, dtype, seed=3)
    gamma = (torch.rand(N, device="cuda") + 0.5).to(dtype)
    beta = torch.randn(N, device="cuda").to(dtype)
    rm = torch.randn(N, device="cuda").to(dtype)
    rv = (torch.rand(N, device="cuda") + 0.5).to(dtype)
    gain = torch.full((N,), float("nan"), device="cuda")
    shift = torch.full((N,), float("nan"), device="cuda")
    _C.fold_eval_affine(gamma, beta, rm, rv, 1e-5, gain, shift, _stream())
    out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    _C.gemm_scale_stats(x, w, out, b, s, gain, shift, None, None, None, _stream())
    y64 = (x.double() @ w.double().T + b.double()) * s.double()
    out64 = (y64 - rm.double()) / torch.sqrt(rv.double() + 1e-5) * gamma.double() + beta.double()
    assert not out.isnan().any()
    assert _rel(out, out64) < GEMM_TOL[dtype_name] * 2


def test_bias_scale_moments_matches_fp64():
    M, N = 1000, 260
    acc = torch.randn(M, N, device="cuda") * 3 + 50  # mean >> std on purpose
    b, s = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    tiles = -(-M // 128)
    pm = torch.full((tiles, N), float("nan"), device="cuda")
    pm2 = torch.full((tiles, N), float("nan"), device="cuda")
    y = torch.full_like(acc, float("nan"))
    counter = torch.zeros(1, device="cuda", dtype=torch.int64)
    _C.bias_scale_moments(acc, y, b, s, pm, pm2, counter, 128, _stream())
    y_ref = (acc.double() + b.double()) * s.double()
    mean_ref, m2_ref = _tile_moments(y.double(), 128)
    # fp32 sums of <= 16 shifted values per thread: a few ulp.
    assert _rel(y, y_ref) < 1e-6
    assert _rel(pm, mean_ref) < 1e-6
    assert _rel(pm2, m2_ref) < 1e-5
    assert counter.item() == 1


def test_bad_arguments_raise_and_launch_nothing():
    x, w, b, s = _problem(64, 64, 64, torch.float32)
    y = torch.full((64, 64), float("nan"), device="cuda")
    with pytest.raises(ValueError, match="weight must have shape"):
        _C.gemm_scale_stats(x, w[:, :32].contiguous(), y, b, s, None, None, None, None, None, _stream())
    with pytest.raises(ValueError, match="must be float32"):
        _C.gemm_scale_stats(x, w, y, b.half(), s, None, None, None, None, None, _stream())
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        x2 = torch.rand(64, 66, device="cuda")
        _C.gemm_scale_stats(x2, torch.rand(64, 66, device="cuda"), y, b, s, None, None, None, None, None, _stream())
    torch.cuda.synchronize()
    assert y.isnan().all(), "a rejected call must not write"
