"""The native module's configuration table, without a GPU (runs wherever the extension is built, CI too)."""

import pytest

_C = pytest.importorskip("gemmbn._C", reason="the native extension is not built")

DTYPES = ("float32", "bfloat16", "float16")
FIELDS = {"tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n", "epilogue_n", "pingpong", "raster", "swizzle"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_row_is_a_valid_configuration(dtype):
    rows = _C.gemm_configs(dtype)
    assert rows, "a dtype without configurations"
    for row in rows:
        assert set(row) == FIELDS
        # A ping-pong warpgroup owns a 64-row tile; a cooperative pair a 128-row one (CUTLASS's epilogue
        # builder and the statistics node need the epilogue subtile to span the tile's rows).
        assert row["tile_m"] == (64 if row["pingpong"] else 128)
        assert row["tile_n"] % 16 == 0 and row["cluster_m"] >= 1 and row["cluster_n"] >= 1
        assert row["raster"] in (0, 1, 2) and row["swizzle"] in (1, 2, 4, 8)
        assert row["epilogue_n"] == 0 or row["tile_n"] % row["epilogue_n"] == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_config_reports_the_row_used(dtype):
    rows = _C.gemm_configs(dtype)
    for index, row in enumerate(rows):
        assert _C.gemm_config(dtype, 1000, 264, 512, index) == (row["tile_m"], row["tile_n"])
    assert _C.gemm_config(dtype, 16384, 4096, 4096) in {(r["tile_m"], r["tile_n"]) for r in rows}
    with pytest.raises(ValueError, match="config"):
        _C.gemm_config(dtype, 1000, 264, 512, len(rows))


@pytest.mark.parametrize("dtype", DTYPES)
def test_selection_follows_the_measured_rule(dtype):
    # select_config: TF32 at M <= 2048 takes row 1 (cooperative 128x256), everything else row 0
    # (ping-pong 64x256, 2x1 cluster); configs.h quotes the sweeps behind it.
    rows = _C.gemm_configs(dtype)
    tile = {index: (row["tile_m"], row["tile_n"]) for index, row in enumerate(rows)}
    assert (rows[0]["tile_m"], rows[0]["tile_n"], rows[0]["pingpong"], rows[0]["cluster_m"]) == (64, 256, 1, 2)
    for M in (16384, 2049, 2048, 1024):
        expected = 1 if dtype == "float32" and M <= 2048 else 0
        assert _C.gemm_config(dtype, M, 8192, 8192) == tile[expected]
    if dtype == "float32":
        assert (rows[1]["tile_m"], rows[1]["tile_n"], rows[1]["pingpong"], rows[1]["cluster_m"]) == (128, 256, 0, 1)
