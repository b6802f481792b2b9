"""The native kernels one at a time (gemmbn.debug over torch.ops.gemmbn_debug) and the forward operators against
float64 references and against each other, without the Python layer on top.

Outputs and workspaces are poisoned with NaN before each launch, so an element a kernel fails to
write shows up as NaN. Skipped where there is no sm90 GPU; fails where one is but nothing is built.
"""

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm90 (Hopper) GPU", allow_module_level=True)

from _gpu import poison_next_allocation, require_extension  # noqa: E402

from gemmbn import debug, fused  # noqa: E402
from gemmbn._native import operators  # noqa: E402

require_extension()

# The GEMM's operand types: name -> (dtype of x, W, y; split). "split" is the fp32-faithful GEMM:
# float32 data, W through split_weight's scaled fp16 pairs, x split in the kernel.
OPERANDS = {
    "float32": (torch.float32, False),
    "bfloat16": (torch.bfloat16, False),
    "float16": (torch.float16, False),
    "split": (torch.float32, True),
}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

# Relative Frobenius error of y = (x W^T + b) s against float64, K <= 4096:
# TF32 rounds operands to 10 mantissa bits (unit roundoff 2^-11 ~ 4.9e-4) -> ~5e-4 typical;
# bf16 operands and output have 8 bits (2^-8 ~ 3.9e-3); fp16 operands and output 11 bits.
# split: at least as good as cuBLAS's SGEMM, 1.1e-6 at K=4096 (shared/measurements.md): its operands
# keep 22 bits (2^-22 per product, random in sign: ~1e-7 of a dot product, perf/split_accuracy_model.py)
# and the tensor cores sum 128 columns at a time before an fp32 promotion; y itself is rounded to fp32.
GEMM_TOL = {"float32": 2e-3, "bfloat16": 1.5e-2, "float16": 2e-3, "split": 1e-6}


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _dtype(name):
    return OPERANDS[name][0]


def _split_operands(w):
    """The split_weight operator's output for w, its allocation poisoned first so an unwritten element shows."""
    N, K = w.shape
    poison_next_allocation((N, debug.split_weight_columns(K)), torch.float16)
    return operators().split_weight(w)


def _problem(M, K, N, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(M, K, device="cuda", generator=g).to(dtype)
    w = ((torch.rand(N, K, device="cuda", generator=g) * 2 - 1) / math.sqrt(K)).to(dtype)
    b = (torch.rand(N, device="cuda", generator=g) - 0.5).to(dtype)
    s = torch.randn(N, device="cuda", generator=g).to(dtype)
    return x, w, b, s


def _workspace(dtype_name, M, N, K, config=-1, split=False, splits=-1, raster=-1, swizzle=-1, statistics=True):
    """The stream-K rows' workspace, poisoned (the launch must zero what it relies on), else None."""
    size = debug.gemm_workspace_bytes(dtype_name, M, N, K, config, split, splits, statistics, raster, swizzle)
    return torch.full((size,), 0xA5, device="cuda", dtype=torch.uint8) if size else None


def _gemm(x, w, b, s, name, stats=True, counter=None, config=-1, raster=-1, swizzle=-1, gain=None, shift=None,
          splits=-1):
    """One gemm_scale_stats launch of the operand type `name`: (y, partial means, partial M2s, rows per partial)."""
    M, N, K = x.shape[0], w.shape[0], x.shape[1]
    split = OPERANDS[name][1]
    tile_m, _ = debug.gemm_config(DTYPE_NAMES[x.dtype], M, N, K, config, split)
    tiles = -(-M // tile_m)
    y = torch.full((M, N), float("nan"), device="cuda", dtype=x.dtype)
    pm = torch.full((tiles, N), float("nan"), device="cuda") if stats else None
    pm2 = torch.full((tiles, N), float("nan"), device="cuda") if stats else None
    workspace = _workspace(DTYPE_NAMES[x.dtype], M, N, K, config, split, splits, raster, swizzle, stats)
    debug.gemm_scale_stats(x, w, y, b, s, gain, shift, pm, pm2, counter, config=config, raster=raster,
                        swizzle=swizzle, splits=splits, workspace=workspace, **_split_keywords(name, w, M))
    return y, pm, pm2, tile_m


def _bitwise_equal(a, c):
    """Equal bits, NaN poison included (a row block a build leaves unwritten: debug.ragged_tile_from_y)."""
    if a is None or c is None:
        return a is None and c is None
    as_int = {4: torch.int32, 2: torch.int16}[a.element_size()]
    return a.dtype == c.dtype and torch.equal(a.view(as_int), c.view(as_int))


def _tile_moments(acc64, tile_m):
    means, m2s = [], []
    for start in range(0, acc64.shape[0], tile_m):
        tile = acc64[start:start + tile_m]
        mean = tile.mean(0)
        means.append(mean)
        m2s.append(((tile - mean) ** 2).sum(0))
    return torch.stack(means), torch.stack(m2s)


SHAPES = [(1000, 512, 264), (2, 64, 64), (129, 256, 520), (300, 1024, 1032)]


def _check_gemm_and_partials(x, w, b, s, name, **launch):
    """One gemm_scale_stats launch (launch: config/raster/swizzle overrides) against float64."""
    y, pm, pm2, tile_m = _gemm(x, w, b, s, name, **launch)
    torch.cuda.synchronize()
    y_ref = (x.double() @ w.double().T + b.double()) * s.double()
    assert not y.isnan().any(), "unwritten output elements"
    assert _rel(y, y_ref) < GEMM_TOL[name]
    if not launch.get("stats", True):
        return  # a row without the statistics node
    if y.shape[0] % tile_m != 0 and debug.ragged_tile_from_y():
        # This build leaves the ragged last row block's statistics to the finish (api.h kRaggedTileFromY): its
        # partials stay as poisoned, and the full row blocks' are checked.
        assert pm[-1].isnan().all() and pm2[-1].isnan().all(), "the ragged row block's partials must stay unwritten"
        pm, pm2 = pm[:-1], pm2[:-1]
        if pm.shape[0] == 0:
            return  # no full row block (M < tile_m)
    assert not pm.isnan().any() and not pm2.isnan().any(), "unwritten partials"
    # The partials describe y as stored: against float64 statistics of the kernel's own y, only the
    # reduction errs (fp32 per-thread two-pass moments and Chan merges over <= 256 rows: a few ulp).
    mean_ref, m2_ref = _tile_moments(y.double()[: pm.shape[0] * tile_m], tile_m)
    assert _rel(pm, mean_ref) < 1e-5
    assert _rel(pm2, m2_ref) < 1e-5


@pytest.mark.parametrize("name", list(OPERANDS))
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_gemm_output_and_partials(name, M, K, N):
    _check_gemm_and_partials(*_problem(M, K, N, _dtype(name)), name)


# K not a multiple of the split GEMM's 32-column k-tile (nor of 16): the last k-tile is part zeros.
@pytest.mark.parametrize("M,K,N", [(1000, 100, 264), (130, 36, 132), (257, 4100, 128)])
def test_split_gemm_ragged_k(M, K, N):
    _check_gemm_and_partials(*_problem(M, K, N, torch.float32), "split")


# Every row of every configuration table (select_config may pick any of them for some shape), under
# the default and two other tile orders: M = 1000 has 7 full M-tiles and a ragged one, N = 264 a ragged
# N-tile, so both reductions of the statistics node and the bounds of the stores are exercised.
CONFIG_ROWS = [
    (name, row)
    for name, (dtype, split) in OPERANDS.items()
    for row in range(len(debug.gemm_configs(DTYPE_NAMES[dtype], split)))
]


@pytest.mark.parametrize("name,row", CONFIG_ROWS)
@pytest.mark.parametrize("raster,swizzle", [(-1, -1), (1, 2), (2, 8)])
def test_every_configuration_row(name, row, raster, swizzle):
    problem = _problem(1000, 512, 264, _dtype(name), seed=row)
    statistics = bool(_row(name, row)["statistics"])  # a row without the node runs without partials
    _check_gemm_and_partials(*problem, name, config=row, raster=raster, swizzle=swizzle, stats=statistics)
    if not statistics:  # and refuses them, launching nothing
        x, w, b, s = problem
        y = torch.full((1000, 264), float("nan"), device="cuda", dtype=x.dtype)
        partials = torch.full((2, -(-1000 // _row(name, row)["partial_rows"]), 264), float("nan"), device="cuda")
        with pytest.raises(RuntimeError, match="statistics node"):
            debug.gemm_scale_stats(x, w, y, b, s, None, None, partials[0], partials[1], None, config=row,
                                   **_split_keywords(name, w, 1000))
        torch.cuda.synchronize()
        assert y.isnan().all() and partials.isnan().all(), "a refused call must launch nothing"


def _row(name, row):
    """Row `row` of the operand type's configuration table (debug.gemm_configs)."""
    return debug.gemm_configs(DTYPE_NAMES[_dtype(name)], OPERANDS[name][1])[row]


STREAM_K_ROWS = [(name, row) for name, row in CONFIG_ROWS if _row(name, row)["stream_k"]]


MERGE_PER_TILE_ROWS = [(name, row) for name, row in CONFIG_ROWS if _row(name, row)["merge_per_tile"]]


@pytest.mark.parametrize("name,row", MERGE_PER_TILE_ROWS)  # experiment rows: none in a default build
def test_merge_per_tile_rows_across_many_tiles(name, row):
    # The node's per-tile merge reuses its shared memory from tile to tile with no barrier of its own (CUTLASS's
    # store after the merge orders them): 33 x 9 tiles on at most 132 SMs, so CTAs run several, with a ragged last
    # M tile (8 rows: the per-subtile path) and a ragged last N tile (8 columns).
    problem = _problem(8200, 512, 1032, _dtype(name), seed=row)
    _check_gemm_and_partials(*problem, name, config=row)
    first, second = _gemm(*problem, name, config=row), _gemm(*problem, name, config=row)
    for a, c in zip(first[:3], second[:3]):
        assert _bitwise_equal(a, c), "a fixed merge order must give the same bits on every run"


@pytest.mark.parametrize("name,row", STREAM_K_ROWS)
@pytest.mark.parametrize("M,K,N,splits", [(1000, 512, 264, 3), (300, 4096, 1032, 4), (4000, 2048, 4096, -1),
                                          (300, 4096, 1032, 1)])
def test_stream_k_rows_sum_their_splits(name, row, M, K, N, splits):
    # Split-K (splits > 1) and, through the rule (-1: select_splits picks 1 for these 1024 tiles), the heuristic's
    # data-parallel waves plus stream-K remainder: every tile's partial accumulators from several CTAs, summed
    # before the epilogue runs once per tile.
    problem = _problem(M, K, N, _dtype(name), seed=row + M)
    _check_gemm_and_partials(*problem, name, config=row, splits=splits)
    first = _gemm(*problem, name, config=row, splits=splits)
    second = _gemm(*problem, name, config=row, splits=splits)
    for a, c in zip(first[:3], second[:3]):
        assert _bitwise_equal(a, c), "the fixed-order reduction must give the same bits on every run"


def test_stream_k_workspace_is_checked():
    if not STREAM_K_ROWS:
        pytest.skip("no stream-K row in the tables")
    name, row = STREAM_K_ROWS[0]
    x, w, b, s = _problem(1000, 512, 264, _dtype(name))
    dtype_name = DTYPE_NAMES[x.dtype]
    size = debug.gemm_workspace_bytes(dtype_name, 1000, 264, 512, row)
    assert size > 0
    y = torch.full((1000, 264), float("nan"), device="cuda", dtype=x.dtype)
    short = torch.empty(size - 1, device="cuda", dtype=torch.uint8)
    for workspace in (None, short):
        with pytest.raises(RuntimeError, match="workspace"):
            debug.gemm_scale_stats(x, w, y, b, s, None, None, None, None, None, config=row,
                                workspace=workspace)
    torch.cuda.synchronize()
    assert y.isnan().all(), "a refused call must launch nothing"


def test_dram_bandwidth_the_rule_reads():
    # select_config's device fact (gemm_dispatch.cpp): memory clock x 2 x bus width. The datasheet peaks: H100 SXM
    # 3.35 TB/s (its 2x2-cluster rows; within these bounds on one, v55), H200 4.8 TB/s (not; not yet read on one, so
    # its bounds allow the reported memory clock some slack while keeping well clear of the rule's 4000); a unit slip
    # (kHz, bits) is off by 8x or 1000x.
    gbps, name = debug.device_dram_gbps(), torch.cuda.get_device_name()
    assert 1000 < gbps < 10000, (gbps, name)
    if "H200" in name:
        assert 4400 <= gbps <= 5200, (gbps, name)
    elif "H100" in name and "HBM3" in name:
        assert 3250 <= gbps <= 3450, (gbps, name)
    # The rule's default, the current device, reads that value: a tall eval launch and a long-K TF32 training launch
    # (the 256x128 tile with the node under 4 TB/s: v60) agree with it named.
    for dtype in ("float32", "bfloat16"):
        named = debug.gemm_selected_config(dtype, 65536, 1024, 1024, statistics=False, dram_gbps=gbps)
        assert debug.gemm_selected_config(dtype, 65536, 1024, 1024, statistics=False) == named, dtype
    named = debug.gemm_selected_config("float32", 16384, 4096, 4096, dram_gbps=gbps)
    assert debug.gemm_selected_config("float32", 16384, 4096, 4096) == named
    assert debug.gemm_configs("float32")[named]["merge_per_tile"] == (gbps < 4000), (named, gbps)


def test_configuration_overrides_are_checked():
    x, w, b, s = _problem(256, 64, 64, torch.float32)
    y = torch.empty(256, 64, device="cuda")
    rows = len(debug.gemm_configs("float32"))
    for kwargs, message in (({"config": rows}, "config"), ({"raster": 3}, "raster"), ({"swizzle": 3}, "swizzle"),
                            ({"splits": 2}, "stream-K")):
        with pytest.raises(RuntimeError, match=message):
            debug.gemm_scale_stats(x, w, y, b, s, None, None, None, None, None, **kwargs)


@pytest.mark.parametrize("name", list(OPERANDS))
def test_partials_survive_a_large_mean(name):
    # Every row is ~1.03 + a small variation, so each column's mean is ~100x its std: a raw fp32
    # sum-of-squares formula would lose ~1e-3 of the variance; the shifted, Chan-merged reduction keeps
    # it to a few ulp of the statistics of y as stored.
    dtype = _dtype(name)
    M, K, N = 512, 256, 256
    g = torch.Generator(device="cuda").manual_seed(5)
    x = (1 + torch.randint(0, 8, (M, K), device="cuda", generator=g) / 128).to(dtype)
    w = (torch.randint(-8, 9, (N, K), device="cuda", generator=g) / 64).to(dtype)
    b, s = torch.zeros(N, device="cuda", dtype=dtype) + 0.25, torch.ones(N, device="cuda", dtype=dtype)
    y, pm, pm2, tile_m = _gemm(x, w, b, s, name)
    mean_ref, m2_ref = _tile_moments(y.double(), tile_m)
    assert (mean_ref.abs() / (m2_ref / tile_m).sqrt()).median() > 20, "the test needs mean >> std"
    assert _rel(pm, mean_ref) < 1e-6
    assert _rel(pm2, m2_ref) < 1e-5


# The finish's walks over the epilogue's partials, each forced per launch: phase 1 behind a grid barrier, then phase 2's
# items walked statically or claimed (GEMMBN_FINISH_CLAIMS); or the local walk, each block merging its own stripe's
# statistics without a grid barrier (GEMMBN_FINISH_LOCAL_MERGE; the rule's up to 16 partials per column).
FINISH_WALKS = {"static": {"GEMMBN_FINISH_CLAIMS": "0", "GEMMBN_FINISH_LOCAL_MERGE": "0"},
                "claims": {"GEMMBN_FINISH_CLAIMS": "1", "GEMMBN_FINISH_LOCAL_MERGE": "0"},
                "local": {"GEMMBN_FINISH_CLAIMS": "", "GEMMBN_FINISH_LOCAL_MERGE": "1"}}  # fmt: skip


@pytest.mark.parametrize("walk", list(FINISH_WALKS))
@pytest.mark.parametrize("name", list(OPERANDS))
@pytest.mark.parametrize("momentum", [0.1, None])
def test_training_pipeline(name, momentum, walk, monkeypatch):
    for variable, value in FINISH_WALKS[walk].items():
        monkeypatch.setenv(variable, value)
    dtype = _dtype(name)
    M, K, N = 1000, 512, 264
    x, w, b, s = _problem(M, K, N, dtype, seed=1)
    gamma = (torch.rand(N, device="cuda") + 0.5).to(dtype)
    beta = torch.randn(N, device="cuda").to(dtype)
    running_mean = torch.randn(N, device="cuda").to(dtype)
    running_var = (torch.rand(N, device="cuda") + 0.5).to(dtype)
    rm0, rv0 = running_mean.double().clone(), running_var.double().clone()
    counter = torch.tensor([4], device="cuda", dtype=torch.int64)
    y, pm, pm2, tile_m = _gemm(x, w, b, s, name, counter=counter)
    out = torch.full_like(y, float("nan"))
    save_mean = torch.full((N,), float("nan"), device="cuda")
    save_invstd = torch.full((N,), float("nan"), device="cuda")
    debug.finish_normalize(y, out, pm, pm2, tile_m, gamma, beta, running_mean, running_var, counter,
                        momentum, 1e-5, save_mean, save_invstd)
    torch.cuda.synchronize()
    assert counter.item() == 5, "the GEMM increments num_batches_tracked exactly once"

    # Reference: BatchNorm in float64 of y as the kernel stored it (PyTorch's BatchNorm, too, sees its
    # input after rounding to dtype); y itself is checked against float64 in the test above.
    y64 = y.double()
    mean64, var64 = y64.mean(0), y64.var(0, unbiased=False)
    out64 = (y64 - mean64) / torch.sqrt(var64 + 1e-5) * gamma.double() + beta.double()
    assert not out.isnan().any()
    # Statistics exact to a few fp32 ulp; the output is rounded once to dtype (2^-9 bf16, 2^-12 fp16).
    out_tol = {torch.float32: 1e-5, torch.bfloat16: 4e-3, torch.float16: 5e-4}[dtype]
    assert _rel(out, out64) < out_tol
    assert _rel(save_mean, mean64) < 1e-5
    assert _rel(save_invstd, 1 / torch.sqrt(var64 + 1e-5)) < 1e-5
    f = 1 / 5 if momentum is None else momentum
    rm_ref = (1 - f) * rm0 + f * mean64
    rv_ref = (1 - f) * rv0 + f * var64 * M / (M - 1)
    # Running statistics are stored in dtype: its rounding bounds the error.
    stat_tol = {torch.float32: 1e-5, torch.bfloat16: 4e-3, torch.float16: 5e-4}[dtype]
    assert _rel(running_mean, rm_ref) < stat_tol
    assert _rel(running_var, rv_ref) < stat_tol


@pytest.mark.parametrize("walk", ["static", "local"])
@pytest.mark.parametrize("mean_offset", [1e4, -3e2])
def test_finish_survives_an_outlying_first_tile(mean_offset, walk, monkeypatch):
    for variable, value in FINISH_WALKS[walk].items():
        monkeypatch.setenv(variable, value)
    # finish_normalize shifts its fp64 sums by tile 0's mean; here tile 0 sits far from every other row
    # and every column's mean far from 0, so a wrong shift, weight or count shows against float64. The
    # partials are computed here in float64 from y, as the GEMM's node defines them, then rounded to fp32.
    M, N, tile_rows = 4096, 264, 64
    g = torch.Generator(device="cuda").manual_seed(11)
    y = 50 + torch.randn(M, N, device="cuda", generator=g, dtype=torch.float64)
    y[:tile_rows] += mean_offset
    y = y.float()
    tiles = y.double().view(M // tile_rows, tile_rows, N)
    pm = tiles.mean(1).float()
    pm2 = ((tiles - tiles.mean(1, keepdim=True)) ** 2).sum(1).float()
    gamma, beta = torch.ones(N, device="cuda"), torch.zeros(N, device="cuda")
    out = torch.full_like(y, float("nan"))
    save_mean = torch.full((N,), float("nan"), device="cuda")
    save_invstd = torch.full((N,), float("nan"), device="cuda")
    debug.finish_normalize(y, out, pm, pm2, tile_rows, gamma, beta, None, None, None, 0.1, 1e-5, save_mean,
                        save_invstd)
    torch.cuda.synchronize()
    y64 = y.double()
    mean64, var64 = y64.mean(0), y64.var(0, unbiased=False)
    # fp32 partials carry ~6e-8 of |tile mean| each; the merge itself adds nothing visible in fp64.
    assert _rel(save_mean, mean64) < 1e-6
    assert _rel(save_invstd, 1 / torch.sqrt(var64 + 1e-5)) < 1e-6
    assert _rel(out, (y64 - mean64) / torch.sqrt(var64 + 1e-5)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_finish_claims_match_the_static_walk(dtype, monkeypatch):
    # Phase 2's items claimed from a counter (GEMMBN_FINISH_CLAIMS=1; the rule's choice for large launches) or walked
    # statically (=0) run the same arithmetic per element: the same bits in the output, the statistics and the running
    # statistics, and the output and statistics against float64. M is no multiple of the 64-row pass, N spans stripes
    # and a partial one.
    M, N, tile_rows = 3001, 1032, 64
    g = torch.Generator(device="cuda").manual_seed(12)
    y = (3 + torch.randn(M, N, device="cuda", generator=g, dtype=torch.float64)).to(dtype)
    rows = y.double().split(tile_rows)
    pm = torch.stack([r.mean(0) for r in rows]).float()
    pm2 = torch.stack([(r - r.mean(0)).square().sum(0) for r in rows]).float()
    gamma = (torch.rand(N, device="cuda", generator=g) + 0.5).to(dtype)
    beta = torch.randn(N, device="cuda", generator=g).to(dtype)
    running = torch.randn(2, N, device="cuda", generator=g).abs().to(dtype)
    results = {}
    monkeypatch.setenv("GEMMBN_FINISH_LOCAL_MERGE", "0")  # the barrier walk (47 partials per column: its rule's too)
    for walk in ("0", "1"):
        monkeypatch.setenv("GEMMBN_FINISH_CLAIMS", walk)
        out = torch.full_like(y, float("nan"))
        save = torch.full((2, N), float("nan"), device="cuda")
        mean_var = running.clone()
        debug.finish_normalize(y, out, pm, pm2, tile_rows, gamma, beta, mean_var[0], mean_var[1], None, 0.1, 1e-5,
                               save[0], save[1])
        results[walk] = (out, save, mean_var)
    torch.cuda.synchronize()
    for static, claimed in zip(results["0"], results["1"]):
        assert torch.equal(static, claimed)
    out, save, _ = results["1"]
    y64 = y.double()
    mean64, var64 = y64.mean(0), y64.var(0, unbiased=False)
    out64 = (y64 - mean64) / torch.sqrt(var64 + 1e-5) * gamma.double() + beta.double()
    # The statistics to a few fp32 ulp; the output rounded once to dtype (2^-9 bf16, 2^-12 fp16).
    assert _rel(save[0], mean64) < 1e-6
    assert _rel(save[1], 1 / torch.sqrt(var64 + 1e-5)) < 1e-5
    assert _rel(out, out64) < {torch.float32: 1e-5, torch.bfloat16: 4e-3, torch.float16: 5e-4}[dtype]


@pytest.mark.parametrize("name", list(OPERANDS))
def test_deterministic(name):
    x, w, b, s = _problem(1000, 512, 264, _dtype(name), seed=2)
    first = _gemm(x, w, b, s, name)
    second = _gemm(x, w, b, s, name)
    for a, c in zip(first[:3], second[:3]):
        assert _bitwise_equal(a, c)


def _eval_problem(name, seed, M=333, K=256, N=264):
    """x, w, b, s (as _problem) and an eval forward's gamma, beta, running mean and running var."""
    dtype = _dtype(name)
    x, w, b, s = _problem(M, K, N, dtype, seed=seed)
    gamma = (torch.rand(N, device="cuda") + 0.5).to(dtype)
    beta = torch.randn(N, device="cuda").to(dtype)
    rm = torch.randn(N, device="cuda").to(dtype)
    rv = (torch.rand(N, device="cuda") + 0.5).to(dtype)
    return x, w, b, s, gamma, beta, rm, rv


def _folded_affine(gamma, beta, rm, rv, b=None, s=None):
    """fold_eval_affine's (gain, shift), poisoned before the launch; b and s folded in when given."""
    N = rm.shape[0]
    gain = torch.full((N,), float("nan"), device="cuda")
    shift = torch.full((N,), float("nan"), device="cuda")
    debug.fold_eval_affine(gamma, beta, rm, rv, 1e-5, gain, shift, bias=b, scale=s)
    return gain, shift


@pytest.mark.parametrize("fold_linear", [False, True], ids=["bias-scale-in-gemm", "bias-scale-folded"])
@pytest.mark.parametrize("name", list(OPERANDS))
def test_eval_folded_affine(name, fold_linear):
    """The GEMM's gain/shift epilogue with the fold's vectors against float64: bias and scale applied by the GEMM,
    or folded into the gain and shift (the eval operator's way) and the GEMM run without them."""
    x, w, b, s, gamma, beta, rm, rv = _eval_problem(name, seed=3)
    if fold_linear:
        gain, shift = _folded_affine(gamma, beta, rm, rv, b, s)
        out, _, _, _ = _gemm(x, w, None, None, name, stats=False, gain=gain, shift=shift)
    else:
        gain, shift = _folded_affine(gamma, beta, rm, rv)
        out, _, _, _ = _gemm(x, w, b, s, name, stats=False, gain=gain, shift=shift)
    y64 = (x.double() @ w.double().T + b.double()) * s.double()
    out64 = (y64 - rm.double()) / torch.sqrt(rv.double() + 1e-5) * gamma.double() + beta.double()
    assert not out.isnan().any()
    assert _rel(out, out64) < GEMM_TOL[name] * 2


def test_bad_arguments_raise_and_launch_nothing():
    x, w, b, s = _problem(64, 64, 64, torch.float32)
    y = torch.full((64, 64), float("nan"), device="cuda")
    with pytest.raises(RuntimeError, match="weight must have shape"):
        debug.gemm_scale_stats(x, w[:, :32].contiguous(), y, b, s, None, None, None, None, None)
    with pytest.raises(RuntimeError, match="must be float32"):
        debug.gemm_scale_stats(x, w, y, b.half(), s, None, None, None, None, None)
    with pytest.raises(RuntimeError, match="multiple of 16 bytes"):
        x2 = torch.rand(64, 66, device="cuda")
        debug.gemm_scale_stats(x2, torch.rand(64, 66, device="cuda"), y, b, s, None, None, None, None, None)
    torch.cuda.synchronize()
    assert y.isnan().all(), "a rejected call must not write"


# --- the one-call forwards (train_forward, eval_forward) ---------------------------------------


def _train_case(name, M=1000, K=512, N=264, seed=5):
    """Inputs of a training forward, each call's outputs and scratch poisoned (NaN) by make_outputs()."""
    dtype = _dtype(name)
    x, w, b, s = _problem(M, K, N, dtype, seed=seed)
    gamma = (torch.rand(N, device="cuda") + 0.5).to(dtype)
    beta = torch.randn(N, device="cuda").to(dtype)
    tile_m, _ = debug.gemm_config(DTYPE_NAMES[dtype], M, N, K, -1, OPERANDS[name][1])

    def make_outputs():
        nan = float("nan")
        return (torch.full((M, N), nan, device="cuda", dtype=dtype), torch.full((M, N), nan, device="cuda", dtype=dtype),
                torch.full((2, -(-M // tile_m), N), nan, device="cuda"), torch.full((N,), nan, device="cuda"),
                torch.full((N,), nan, device="cuda"))  # fmt: skip

    return x, w, b, s, gamma, beta, tile_m, make_outputs


def _split_keywords(name, w, M):
    """gemm_scale_stats's split-GEMM keywords for `name` ({} but for "split"), x_scale poisoned."""
    if not OPERANDS[name][1]:
        return {}
    weight_split, weight_unscale = _split_operands(w)
    return {"weight_split": weight_split, "weight_unscale": weight_unscale,
            "x_scale": torch.full((debug.row_scale_count(M),), float("nan"), device="cuda")}  # fmt: skip


def _operator_split(name, w):
    """The forward operators' split-weight arguments for `name`: (weight_split, weight_unscale) or (None, None)."""
    return _split_operands(w) if OPERANDS[name][1] else (None, None)


@pytest.mark.parametrize("name", list(OPERANDS))
@pytest.mark.parametrize("momentum", [0.1, None])
def test_train_forward_is_the_two_launches(name, momentum):
    # The train_forward operator makes gemm_scale_stats + finish_normalize in one call: bitwise what the two
    # single-kernel calls give (test_training_pipeline checks those against float64), with y kept and in place.
    x, w, b, s, gamma, beta, tile_m, make_outputs = _train_case(name)
    M, N = x.shape[0], w.shape[0]
    dtype, split = x.dtype, _split_keywords(name, w, M)
    workspace = _workspace(DTYPE_NAMES[dtype], M, N, x.shape[1], split=bool(split))
    stats0 = torch.randn(N, device="cuda").to(dtype), (torch.rand(N, device="cuda") + 0.5).to(dtype)
    results = []
    for how in ("two launches", "operator", "operator in place"):
        running_mean, running_var = stats0[0].clone(), stats0[1].clone()
        counter = torch.tensor([4], device="cuda", dtype=torch.int64)
        if how == "two launches":
            y, out, partials, save_mean, save_invstd = make_outputs()
            debug.gemm_scale_stats(x, w, y, b, s, None, None, partials[0], partials[1], counter, workspace=workspace,
                                **split)  # fmt: skip
            debug.finish_normalize(y, out, partials[0], partials[1], tile_m, gamma, beta, running_mean, running_var,
                                counter, momentum, 1e-5, save_mean, save_invstd)  # fmt: skip
        else:
            keep = how == "operator"
            poison_next_allocation((M, N), dtype)
            out, _, save_mean, save_invstd = operators().train_forward(
                x, w, b, s, gamma, beta, running_mean, running_var, counter, momentum, 1e-5,
                *_operator_split(name, w), keep,
            )  # fmt: skip
        torch.cuda.synchronize()
        assert counter.item() == 5, f"{how}: num_batches_tracked must move exactly once"
        assert not out.isnan().any(), f"{how}: unwritten output"
        results.append((out, save_mean, save_invstd, running_mean, running_var))
    for other in results[1:]:
        for a, c in zip(results[0], other):
            assert torch.equal(a, c)


def test_train_forward_refuses_before_launching(monkeypatch):
    # A refused call must launch neither kernel: no running statistic or counter moves (the GEMM counts the batch).
    x, w, b, s, gamma, beta, tile_m, make_outputs = _train_case("float32")
    N = w.shape[0]
    running_mean, running_var = torch.randn(N, device="cuda"), torch.rand(N, device="cuda") + 0.5
    rm0, rv0 = running_mean.clone(), running_var.clone()
    counter = torch.tensor([4], device="cuda", dtype=torch.int64)
    good = dict(x=x, weight=w, bias=b, scale=s, gamma=gamma, beta=beta, running_mean=running_mean,
                running_var=running_var, num_batches_tracked=counter, momentum=0.1, eps=1e-5, weight_split=None,
                weight_unscale=None, keep_pre_norm=True)  # fmt: skip
    bad = [
        ({"eps": 0.0}, "is not positive"),
        ({"scale": s[1:]}, "scale must have shape"),
        ({"gamma": gamma.half()}, "gamma must be float32"),
        ({"running_var": None}, "running_mean and running_var go together"),
        ({"num_batches_tracked": counter.float()}, "num_batches_tracked must be one int64 element"),
        ({"x": torch.rand(1000, 514, device="cuda"), "weight": torch.rand(N, 514, device="cuda")}, "multiple"),
    ]
    for change, match in bad:
        with pytest.raises(RuntimeError, match=match):
            operators().train_forward(*{**good, **change}.values())
    for order in ("M3", "X", "N8x"):  # the experiment's tile order (train_forward.cpp), read per call
        monkeypatch.setenv("GEMMBN_TRAIN_TILE_ORDER", order)
        with pytest.raises(RuntimeError, match="GEMMBN_TRAIN_TILE_ORDER must be M or N"):
            operators().train_forward(*good.values())
    monkeypatch.delenv("GEMMBN_TRAIN_TILE_ORDER")
    monkeypatch.setenv("GEMMBN_FINISH_DATAFLOW", "1")  # the walk, whose wait limit is read before anything launches
    for limit in ("-1", "x", "5s", "2e6"):
        monkeypatch.setenv("GEMMBN_FLOW_TIMEOUT_S", limit)
        with pytest.raises(RuntimeError, match="GEMMBN_FLOW_TIMEOUT_S must be a number of seconds"):
            operators().train_forward(*good.values())
    torch.cuda.synchronize()
    assert counter.item() == 4
    assert torch.equal(running_mean, rm0) and torch.equal(running_var, rv0)


@pytest.mark.parametrize("name", list(OPERANDS))
def test_eval_forward_is_the_fold_and_the_gemm(name):
    # The eval_forward operator makes fold_eval_affine (bias and scale folded in) + gemm_scale_stats (without them)
    # in one call: bitwise what the two give (test_eval_folded_affine checks those against float64).
    x, w, b, s, gamma, beta, rm, rv = _eval_problem(name, seed=6)
    M, N, dtype = x.shape[0], w.shape[0], x.dtype
    gain, shift = _folded_affine(gamma, beta, rm, rv, b, s)
    expected, _, _, _ = _gemm(x, w, None, None, name, stats=False, gain=gain, shift=shift)
    poison_next_allocation((M, N), dtype)
    out = operators().eval_forward(x, w, b, s, gamma, beta, rm, rv, 1e-5, *_operator_split(name, w))
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert torch.equal(out, expected)
    with pytest.raises(RuntimeError, match="running_var must have shape"):
        operators().eval_forward(x, w, b, s, gamma, beta, rm, rv[1:], 1e-5, *_operator_split(name, w))


@pytest.mark.parametrize("name", list(OPERANDS))
def test_eval_affine_and_the_folded_forward_are_eval_forward_in_two_calls(name):
    # eval_affine is eval_forward's fold alone ([2, N]: gain, shift) and eval_forward_folded its GEMM: together
    # bitwise eval_forward (the module keeps the first across calls, eval_fold_cache.py).
    x, w, b, s, gamma, beta, rm, rv = _eval_problem(name, seed=7)
    M, N, dtype = x.shape[0], w.shape[0], x.dtype
    split = _operator_split(name, w)
    expected = operators().eval_forward(x, w, b, s, gamma, beta, rm, rv, 1e-5, *split)
    poison_next_allocation((2, N))
    affine = operators().eval_affine(x, w, b, s, gamma, beta, rm, rv, 1e-5)
    gain, shift = _folded_affine(gamma, beta, rm, rv, b, s)
    poison_next_allocation((M, N), dtype)
    out = operators().eval_forward_folded(x, w, affine, *split)
    torch.cuda.synchronize()
    assert torch.equal(affine[0], gain) and torch.equal(affine[1], shift)
    assert not out.isnan().any() and torch.equal(out, expected)
    with pytest.raises(RuntimeError, match=r"affine must have shape \[2, %d\]" % N):
        operators().eval_forward_folded(x, w, affine[:, 1:], *split)
    with pytest.raises(RuntimeError, match="running_var must have shape"):
        operators().eval_affine(x, w, b, s, gamma, beta, rm, rv[1:], 1e-5)


# --- the fp32-faithful split GEMM ---------------------------------------------------------------


def _slice_column(p):
    """kernels/include/gemmbn/f16_split.cuh's column order within a 16-column slice."""
    return 4 * ((p % 8) // 2) + 2 * (p // 8) + p % 2


def _split_weight_reference(w):
    """split_weight's definition in torch: per-row power-of-two scale, fp16 hi/lo, the kernel's column order."""
    N, K = w.shape
    biased = (w.abs().amax(1).view(torch.int32) >> 23) & 0xFF
    biased = biased.clamp(15, 254)
    scale = ((268 - biased) << 23).view(torch.float32)  # 2^(141 - E): row max in [2^14, 2^15)
    unscale = ((biased - 14) << 23).view(torch.float32)
    scaled = w * scale[:, None]
    hi = scaled.half()
    lo = (scaled - hi.float()).half()
    tiles = -(-K // 32)
    order = torch.tensor([_slice_column(p) for p in range(16)], device=w.device)

    def arrange(part):
        padded = torch.zeros(N, tiles * 32, dtype=part.dtype, device=part.device)
        padded[:, :K] = part
        return padded.view(N, tiles, 2, 16)[..., order].reshape(N, tiles, 32)

    return torch.cat([arrange(hi), arrange(lo)], dim=-1).reshape(N, tiles * 64), unscale


def test_split_weight_matches_its_definition():
    # Rows of wildly different magnitudes (each row gets its own scale), a zero row, K % 32 != 0.
    g = torch.Generator(device="cuda").manual_seed(7)
    N, K = 70, 100
    magnitude = 10.0 ** torch.randint(-35, 36, (N, 1), device="cuda", generator=g).float()
    w = torch.randn(N, K, device="cuda", generator=g) * magnitude
    w[3] = 0
    weight_split, weight_unscale = _split_operands(w)
    expected_split, expected_unscale = _split_weight_reference(w)
    torch.cuda.synchronize()
    assert torch.equal(weight_split.view(torch.int16), expected_split.view(torch.int16))
    assert torch.equal(weight_unscale, expected_unscale)
    # And the pair represents the row: (hi + lo) 2^-b = W to 2^-22 relative (fp16's 11 bits, twice).
    parts = weight_split.float().view(N, -1, 2, 32)
    inverse = torch.tensor([_slice_column(p) + 16 * (p // 16) for p in range(32)], device="cuda").argsort()
    rebuilt = ((parts[:, :, 0] + parts[:, :, 1])[..., inverse]).reshape(N, -1)[:, :K] * weight_unscale[:, None]
    assert ((rebuilt.double() - w.double()).abs() <= 2**-21 * w.abs().amax(1, keepdim=True).double()).all()


@pytest.mark.parametrize("R,C", [(1001, 264), (3, 4), (4100, 132), (65, 4096)], ids=lambda v: str(v))
def test_split_columns_is_split_weight_of_the_transpose(R, C):
    """The backward's B operand split straight from t [R, C]: bitwise split_weight(t^T) (its definition, and the
    operator on the transposed copy), columns of wildly different magnitudes and a zero column, the outputs written
    over poison, R not a multiple of the 32-row k-tile nor C of the 128-column tile."""
    g = torch.Generator(device="cuda").manual_seed(R + C)
    magnitude = 10.0 ** torch.randint(-35, 36, (1, C), device="cuda", generator=g).float()
    t = torch.randn(R, C, device="cuda", generator=g) * magnitude
    t[:, C // 2] = 0
    poison_next_allocation((C, debug.split_weight_columns(R)), torch.float16)
    split, unscale = operators().split_columns(t)
    expected_split, expected_unscale = _split_weight_reference(t.t().contiguous())
    via_transpose = operators().split_weight(fused.transpose_padded(t))
    torch.cuda.synchronize()
    assert torch.equal(split.view(torch.int16), expected_split.view(torch.int16))
    assert torch.equal(unscale, expected_unscale)
    assert torch.equal(split.view(torch.int16), via_transpose[0].view(torch.int16))
    assert torch.equal(unscale, via_transpose[1])


# (M, K, N) of a @ b: a ragged K (the transposed copy's zero padding past b's rows), and few output tiles over a long
# K, which select_config sends to the stream-K row (the backward's dW = dz^T x).
@pytest.mark.parametrize("M,K,N", [(1001, 260, 264), (264, 1001, 260), (512, 32768, 256)])
def test_split_matmul_is_as_accurate_as_sgemm(M, K, N):
    """a @ b by split_matmul (b split from its rows) within 2x cuBLAS SGEMM's error against float64, per row, on
    inputs of mixed magnitudes (each row of a and column of b its own)."""
    g = torch.Generator(device="cuda").manual_seed(M + K)
    a_rows = 10.0 ** torch.empty(M, 1, device="cuda").uniform_(-3, 3, generator=g)
    a = torch.randn(M, K, device="cuda", generator=g) * a_rows
    b = torch.randn(K, N, device="cuda", generator=g) * 10.0 ** torch.empty(1, N, device="cuda").uniform_(-3, 3, generator=g)
    a_padded = fused.transpose_padded(a.t().contiguous())  # [M, K'], K' = K rounded up to 4, zeros past K
    poison_next_allocation((M, N))
    product = fused.split_matmul(a_padded, b)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        sgemm = a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    exact = a.double() @ b.double()
    assert torch.isfinite(product).all()
    ours, cublas = _row_relative_error(product, exact), _row_relative_error(sgemm, exact)
    assert ours <= 2 * cublas, f"split {ours:.2e} vs SGEMM {cublas:.2e}"
    assert torch.equal(product, fused.split_matmul(a_padded, b)), "the same bits on every run (fixed-order sums)"
    # a's row scales from maxima given (the transpose's) instead of the GEMM's own pass: the same scales, bits.
    _, row_max, _ = fused.transpose_with_maxima(a_padded)
    assert torch.equal(fused.split_matmul(a_padded, b, row_max), product)


def _hard_inputs(kind, M, K, g):
    if kind == "log-uniform 1e-3..1e3":  # each value's own exponent, random signs
        x = torch.exp(torch.empty(M, K, device="cuda").uniform_(math.log(1e-3), math.log(1e3), generator=g))
        return x * (torch.randint(0, 2, (M, K), device="cuda", generator=g) * 2 - 1)
    if kind == "mean 100, std 1":  # every column of y has |mean| >> std
        return 100 + torch.randn(M, K, device="cuda", generator=g)
    if kind == "rows 1e-30..1e30":  # each row its own magnitude, far outside fp16's range
        rows = 10.0 ** torch.empty(M, 1, device="cuda").uniform_(-30, 30, generator=g)
        return torch.rand(M, K, device="cuda", generator=g) * rows
    if kind == "columns 1e-6..1e6":  # within each row, 32-column blocks of very different size
        blocks = 10.0 ** torch.empty(1, K // 32, 1, device="cuda").uniform_(-6, 6, generator=g)
        return (torch.randn(M, K // 32, 32, device="cuda", generator=g) * blocks).reshape(M, K)
    raise ValueError(kind)


HARD_KINDS = ["log-uniform 1e-3..1e3", "mean 100, std 1", "rows 1e-30..1e30", "columns 1e-6..1e6"]


def _row_relative_error(y, y64):
    """Per-row ||dy|| / ||y64||, the worst row: rows of very different sizes must each be exact."""
    return ((y.double() - y64).norm(dim=1) / y64.norm(dim=1)).max().item()


# The split table's rows whose x split_rows splits before the GEMM (its A operand then comes from shared memory).
PRESPLIT_ROWS = [row for name, row in CONFIG_ROWS if name == "split" and _row(name, row)["presplit"]]


@pytest.mark.parametrize("config", [-1, 0] + PRESPLIT_ROWS)
@pytest.mark.parametrize("kind", HARD_KINDS)
@pytest.mark.parametrize("K", [4096, 8192])
def test_split_gemm_is_as_accurate_as_sgemm_on_hard_inputs(kind, K, config):
    """x @ W^T by the split GEMM (the rule's row, and each presplit row) within 2x cuBLAS SGEMM's error on the same
    inputs (it should be ~10x better)."""
    g = torch.Generator(device="cuda").manual_seed(11)
    M, N = 1024, 512
    x = _hard_inputs(kind, M, K, g)
    w = (torch.rand(N, K, device="cuda", generator=g) * 2 - 1) / math.sqrt(K)
    y, _, _, _ = _gemm(x, w, None, None, "split", stats=False, config=config)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        sgemm = x @ w.T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    y64 = x.double() @ w.double().T
    assert torch.isfinite(y).all()
    ours, cublas = _row_relative_error(y, y64), _row_relative_error(sgemm, y64)
    assert ours <= 2 * cublas, f"split {ours:.2e} vs SGEMM {cublas:.2e}"


@pytest.mark.parametrize("row", PRESPLIT_ROWS)
def test_presplit_rows_sum_what_the_register_split_sums(row):
    """A presplit row feeds the tensor cores the pairs row 0 makes in registers (split_rows and the mainloop's split
    are the same rounding of the same scaled values, in the same k order), in the same order of wgmmas and the same
    promotion groups: its output is bit for bit row 0's."""
    assert _row("split", row)["promote_tiles"] == _row("split", 0)["promote_tiles"], "sums grouped otherwise"
    M, K, N = 1000, 4100, 264  # a ragged M tile, a ragged last k-tile, a ragged N tile
    problem = _problem(M, K, N, torch.float32, seed=row)
    reference, *_ = _gemm(*problem, "split", config=0)
    presplit, *_ = _gemm(*problem, "split", config=row)
    torch.cuda.synchronize()
    assert not presplit.isnan().any(), "unwritten output elements"
    assert torch.equal(presplit, reference)


@pytest.mark.parametrize("row", PRESPLIT_ROWS)
def test_presplit_workspace_is_checked(row):
    """A presplit row's workspace holds x's pairs: none, or one byte short, is refused before anything runs (x_scale
    and y untouched)."""
    x, w, b, s = _problem(1000, 512, 264, torch.float32)
    size = debug.gemm_workspace_bytes("float32", 1000, 264, 512, row, True)
    assert size == 2 * 1000 * debug.split_weight_columns(512)
    keywords = _split_keywords("split", w, 1000)  # x_scale poisoned
    y = torch.full((1000, 264), float("nan"), device="cuda")
    for workspace in (None, torch.empty(size - 1, device="cuda", dtype=torch.uint8)):
        with pytest.raises(RuntimeError, match="workspace"):
            debug.gemm_scale_stats(x, w, y, b, s, None, None, None, None, None, config=row, workspace=workspace,
                                   **keywords)
    torch.cuda.synchronize()
    assert y.isnan().all() and keywords["x_scale"].isnan().all(), "a refused call must launch nothing"


def test_split_arguments_are_checked():
    x, w, b, s = _problem(64, 64, 64, torch.float32)
    y = torch.full((64, 64), float("nan"), device="cuda")
    weight_split, weight_unscale = _split_operands(w)
    x_scale = torch.empty(debug.row_scale_count(64), device="cuda")
    with pytest.raises(RuntimeError, match="go together"):
        debug.gemm_scale_stats(x, w, y, b, s, None, None, None, None, None, weight_split=weight_split,
                            weight_unscale=weight_unscale)
    with pytest.raises(RuntimeError, match="weight_split must have shape"):
        debug.gemm_scale_stats(x, w, y, b, s, None, None, None, None, None,
                            weight_split=weight_split[:, :64].contiguous(), weight_unscale=weight_unscale,
                            x_scale=x_scale)
    with pytest.raises(RuntimeError, match="x_scale must have shape"):
        debug.gemm_scale_stats(x, w, y, b, s, None, None, None, None, None, weight_split=weight_split,
                            weight_unscale=weight_unscale, x_scale=x_scale[:64].contiguous())
    with pytest.raises(RuntimeError, match="float32"):
        xh, wh, yh = x.half(), w.half(), y.half()
        debug.gemm_scale_stats(xh, wh, yh, b.half(), s.half(), None, None, None, None, None,
                            weight_split=weight_split, weight_unscale=weight_unscale, x_scale=x_scale)
    with pytest.raises(RuntimeError, match="weight must be float32, got float16"):
        operators().split_weight(w.half())
    torch.cuda.synchronize()
    assert y.isnan().all(), "a rejected call must not write"
