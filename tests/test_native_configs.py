"""The configuration tables (gemmbn.debug over torch.ops.gemmbn_debug), without a GPU (runs wherever the operators
are built, CI too)."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from gemmbn import _native
from gemmbn import debug

PYTHON_DIR = Path(debug.__file__).resolve().parents[1]  # holds the gemmbn this process imported (conftest.py)
_REASON = _native.load_operators()
if _REASON is not None and "is missing" in _REASON:
    pytest.skip(f"the operators are not built ({_REASON})", allow_module_level=True)

# (dtype, split): the three native operand types and the fp32-faithful split GEMM.
TABLES = [("float32", False), ("bfloat16", False), ("float16", False), ("float32", True)]
TABLE_IDS = ["tf32", "bf16", "fp16", "split"]
FIELDS = {"tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n", "epilogue_n", "pingpong", "raster", "swizzle",
          "promote_tiles", "stream_k", "statistics", "presplit", "merge_per_tile", "partial_rows"}


@pytest.mark.parametrize("dtype,split", TABLES, ids=TABLE_IDS)
def test_every_row_is_a_valid_configuration(dtype, split):
    rows = debug.gemm_configs(dtype, split)
    assert rows, "a table without configurations"
    for row in rows:
        assert set(row) == FIELDS
        # A ping-pong warpgroup owns a 64- or 128-row tile (its epilogue walks 64-row subtiles); a
        # cooperative pair 128 or 256 rows (128-row subtiles). The moments node merges a tile's subtile
        # rows: one statistics partial per tile.
        assert row["tile_m"] in ((64, 128) if row["pingpong"] else (128, 256))
        assert row["partial_rows"] == row["tile_m"]
        assert row["tile_n"] % 16 == 0 and row["cluster_m"] >= 1 and row["cluster_n"] >= 1
        assert row["raster"] in (0, 1, 2) and row["swizzle"] in (1, 2, 4, 8)
        assert row["epilogue_n"] == 0 or row["tile_n"] % row["epilogue_n"] == 0
        # CUTLASS's stream-K scheduler takes cooperative kernels only.
        assert row["stream_k"] in (0, 1) and not (row["stream_k"] and row["pingpong"])
        # A row without the statistics node serves launches without partials (eval, statistics from y) only.
        assert row["statistics"] in (0, 1) and (row["statistics"] or not split)
        # The node's per-tile merge: cooperative rows with the node (its shared memory holds 8 warps' entries).
        assert row["merge_per_tile"] in (0, 1)
        assert not row["merge_per_tile"] or (row["statistics"] and not row["pingpong"])
        if split:
            # The split mainloop: cooperative 128 x 128 tiles of 32-column k-tiles, clusters along M only.
            assert (row["tile_m"], row["tile_n"], row["tile_k"], row["pingpong"], row["cluster_n"]) == (128, 128, 32, 0, 1)
            assert row["promote_tiles"] >= 1
            # x split before the GEMM into the launch's workspace, which a stream-K row keeps for its partial sums.
            assert row["presplit"] in (0, 1) and not (row["presplit"] and row["stream_k"])
        else:
            assert row["promote_tiles"] == 1 and row["presplit"] == 0


@pytest.mark.parametrize("dtype,split", TABLES, ids=TABLE_IDS)
def test_gemm_config_reports_the_row_used(dtype, split):
    rows = debug.gemm_configs(dtype, split)
    for index, row in enumerate(rows):
        assert debug.gemm_config(dtype, 1000, 264, 512, index, split) == (row["partial_rows"], row["tile_n"])
    assert debug.gemm_config(dtype, 16384, 4096, 4096, -1, split) in {(r["partial_rows"], r["tile_n"]) for r in rows}
    with pytest.raises(RuntimeError, match="config"):
        debug.gemm_config(dtype, 1000, 264, 512, len(rows), split)


@pytest.mark.parametrize("dtype,split", TABLES, ids=TABLE_IDS)
def test_workspace_is_asked_for_stream_k_and_presplit_rows_only(dtype, split):
    # Rows without stream-K answer 0 (presplit rows: x's pairs) without touching a device; the stream-K rows' size
    # depends on the device's SM count, so tests/test_native_gpu.py checks those.
    for index, row in enumerate(debug.gemm_configs(dtype, split)):
        if not row["statistics"]:  # a row without the statistics node refuses a launch with partials
            with pytest.raises(RuntimeError, match="statistics node"):
                debug.gemm_workspace_bytes(dtype, 1000, 264, 512, index, split)
            assert debug.gemm_workspace_bytes(dtype, 1000, 264, 512, index, split, statistics=False) == 0
        elif row["presplit"]:  # x's fp16 pairs: 2 x 32 columns per 32-column k-tile of K = 520, 1000 rows
            assert debug.gemm_workspace_bytes(dtype, 1000, 264, 520, index, split) == 2 * 1000 * 17 * 64
        elif not row["stream_k"]:
            assert debug.gemm_workspace_bytes(dtype, 1000, 264, 512, index, split) == 0
            with pytest.raises(RuntimeError, match="stream-K"):
                debug.gemm_workspace_bytes(dtype, 1000, 264, 512, index, split, splits=2)
    with pytest.raises(RuntimeError, match="config"):
        debug.gemm_workspace_bytes(dtype, 1000, 264, 512, len(debug.gemm_configs(dtype, split)), split)


@pytest.mark.parametrize("dtype,split", TABLES, ids=TABLE_IDS)
def test_launches_with_partials_get_a_row_with_the_statistics_node(dtype, split):
    rows = debug.gemm_configs(dtype, split)
    for M in (64, 128, 1000, 2048, 4096, 16384, 65536):
        for N in (64, 512, 1024, 2048, 4096, 8192):
            for K in (64, 512, 1024, 2048, 4096, 8192):
                assert rows[debug.gemm_selected_config(dtype, M, N, K, split)]["statistics"] == 1, (M, K, N)


def test_split_is_float32_only():
    with pytest.raises(RuntimeError, match="float32"):
        debug.gemm_configs("bfloat16", True)


def test_split_workspace_sizes():
    # Per 32-column k-tile: 32 hi parts, then 32 lo parts; K rounds up to whole k-tiles.
    assert [debug.split_weight_columns(K) for K in (4, 32, 36, 4096)] == [64, 64, 128, 8192]
    # x's row scales: whole 128-row tiles.
    assert [debug.row_scale_count(M) for M in (1, 128, 129, 16384)] == [128, 128, 256, 16384]


@pytest.mark.parametrize("dtype,split", TABLES, ids=TABLE_IDS)
def test_selection_follows_the_measured_rule(dtype, split):
    # select_config (gemm_dispatch.cpp; sweeps quoted in configs.h): small problems by their count of
    # 128x128 tiles and K take the 64x64 (row 3: up to 32 tiles, 64 at K <= 1024) or, under a wave with K >= 512, (TF32
    # up to 64 tiles with K > 4096: its stream-K row 6, split-K 2 or 3; else at 49-64 tiles 64x128 tiles on a 2x1
    # cluster, TF32 row 8 and 16-bit row 7, where that cluster pads nothing) the row that makes the most of one wave:
    # 128x96 where that grid fills more than half a wave without passing it (past 64 tiles only where N is a multiple
    # of 96 or K < 4096), else up to 64 tiles 64x128 (row 2), else 128x128; each with x multicast (128x96: TF32 row 11,
    # 16-bit row 10; 128x128: TF32 row 10, 16-bit row 9) where its grid has at most twice as many tiles along N as
    # along M and its 1x2 cluster pads nothing, else with W multicast (rows 5 and 4) where the 2x1 cluster pads
    # nothing;
    # larger ones ping-pong 128x128 with a 2x1 cluster (row 0) except at short M: TF32 the cooperative 128x256 row
    # for 512 < M <= 2048 where the 2x1 cluster would pad a tile (the 64x128 row below 512), 16-bit data the
    # 1x2-cluster row for M <= 2048; short K beyond two waves the 64x128 row (K <= 512: 16-bit always, TF32 up to 16
    # waves; 16-bit K <= 1024 up to 8); row 1 past a wave wherever N <= 1024, K > 4096 and its tiles along N pad
    # nothing (16-bit launches without partials excepted, below); where row 4's cluster pads and K > 4096, TF32's
    # cooperative stream-K 128x128 row (row 6). split:
    # 128x128 tiles, its stream-K row (row 1) under a wave of tiles with K > 1024; else from N = 768 x split before
    # the GEMM on a 2x1 cluster (row 2; row 3 without it where an odd count of M tiles would pad one), below x split in
    # registers (row 0).
    rows = debug.gemm_configs(dtype, split)
    layout = lambda r: (r["tile_m"], r["tile_n"], r["pingpong"], r["cluster_m"], r["cluster_n"])  # noqa: E731
    tf32 = dtype == "float32" and not split
    if split:
        assert layout(rows[0]) == layout(rows[1]) == layout(rows[3]) == (128, 128, 0, 1, 1)
        assert layout(rows[2]) == (128, 128, 0, 2, 1)
        assert [r["stream_k"] for r in rows] == [0, 1, 0, 0] and [r["presplit"] for r in rows] == [0, 0, 1, 1]
    else:
        assert layout(rows[0]) == (128, 128, 1, 2, 1)
        assert layout(rows[1]) == ((128, 256, 0, 1, 1) if tf32 else (128, 128, 1, 1, 2))
        assert layout(rows[2]) == (64, 128, 1, 1, 1)
        assert layout(rows[3]) == (64, 64, 1, 1, 1)
        # select_config's one-wave rows (4: 128x128, 5: 128x96) in both tables, TF32's stream-K row (6).
        assert layout(rows[4]) == (128, 128, 0, 2, 1) and rows[4]["stream_k"] == 0
        assert layout(rows[5]) == (128, 96, 0, 2, 1) and rows[5]["stream_k"] == 0
        # Row 0's tile without the statistics node (TF32 row 7, 16-bit row 6: 64-column subtiles fit without the
        # node), for launches without partials; past it the 64x128 row with a 2x1 cluster, then cuBLAS's cooperative
        # 256x128 tile with x multicast, without the node (launches without partials from K = 2048).
        without = 7 if tf32 else 6
        assert layout(rows[without]) == layout(rows[0]) and rows[without]["statistics"] == 0
        assert rows[without]["epilogue_n"] == (32 if tf32 else 64)
        pair, wide_tile = without + 1, without + 2
        assert layout(rows[pair]) == (64, 128, 1, 2, 1) and rows[pair]["statistics"] == 1
        assert layout(rows[wide_tile]) == (256, 128, 0, 1, 2) and rows[wide_tile]["statistics"] == 0
        # TF32's with 128x16 epilogue subtiles: fp32 y's 128x32 ones left its mainloop 3 stages, these 4 (v45)
        assert rows[wide_tile]["epilogue_n"] == (16 if tf32 else 0)
        # Rows 4 and 5 with x multicast instead of W, their tiles along M (v47, v50).
        for one_wave_x, tile_n in ((wide_tile + 1, 128), (wide_tile + 2, 96)):
            assert layout(rows[one_wave_x]) == (128, tile_n, 0, 1, 2) and rows[one_wave_x]["statistics"] == 1
            assert rows[one_wave_x]["raster"] == 1 and rows[one_wave_x]["stream_k"] == 0
        # Row 0's tile without the node on a 2x2 cluster (TF32 row 12, 16-bit row 11): tall outputs' launches without
        # partials at 512 < K <= 1024 (v52). The experimental rows of CMake GEMMBN_EXPERIMENT_ROWS=ON follow.
        tall = wide_tile + 3
        assert layout(rows[tall]) == (128, 128, 1, 2, 2) and rows[tall]["statistics"] == 0
        assert rows[tall]["epilogue_n"] == rows[without]["epilogue_n"] and rows[tall]["raster"] == 0
        assert all(r["statistics"] for r in rows[:without])
        if tf32:
            assert layout(rows[6]) == (128, 128, 0, 1, 1) and rows[6]["stream_k"] == 1
            # TF32 row 13: the 256x128 tile with the node merged once per tile (long-K training forwards past 2048
            # tiles on devices under 4 TB/s of DRAM: v60), the only default row that merges per tile.
            wide_node = tall + 1
            assert layout(rows[wide_node]) == layout(rows[wide_tile]) and rows[wide_node]["statistics"] == 1
            assert rows[wide_node]["epilogue_n"] == rows[wide_tile]["epilogue_n"] == 16
        merging = [i for i, r in enumerate(rows) if r["merge_per_tile"]]
        if tf32:
            assert merging == [tall + 1]
        else:  # 16-bit: experiment rows only (past the default table's last row)
            assert all(i > tall for i in merging)
    # (M, K, N) -> (TF32 row, 16-bit row), the measured shapes of configs.h plus the boundaries.
    expected_rows = {
        (128, 1024, 512): (3, 3),  # 4 tiles
        (256, 1024, 1024): (3, 3),  # 16 tiles
        (512, 2048, 512): (3, 3),  # 16 tiles, K > 1024
        (1024, 1024, 1024): (3, 3),  # 64 tiles, short K
        (128, 4096, 4096): (3, 3),  # 32 tiles
        (1024, 8192, 512): (3, 3),
        (512, 2048, 2048): (8, 7),  # 64 tiles: 64x128 tiles in 2x1 clusters from 49 tiles (TF32: K <= 4096)
        (256, 4096, 4096): (8, 7),
        (256, 4096, 3200): (8, 7),  # 50 tiles
        (192, 4096, 4096): (5, 5),  # 3 64-row tiles along M: TF32's 2x1 cluster of them would pad
        (256, 8192, 4096): (6, 7),  # K > 4096: TF32's stream-K row (split-K 2)
        (256, 16384, 4096): (6, 7),
        (512, 8192, 2048): (6, 7),
        (256, 4096, 3072): (2, 2),  # 64 of 128x96: half a wave
        (384, 4096, 2048): (2, 2),  # 3 tiles along M: the 2x1 cluster would pad
        (384, 8192, 2048): (6, 2),  # the same at K > 4096: TF32's stream-K row
        (128, 8192, 8192): (6, 7),  # 64 tiles, one along M (two of 64 rows)
        (128, 4096, 8192): (8, 7),  # the same at K = 4096
        (1024, 512, 1536): (11, 10),  # K = 512 under a wave: the one-wave rows too
        (1536, 512, 1024): (5, 5),  # 11 tiles of 96 columns: the 1x2 cluster would pad
        (1024, 512, 2048): (10, 9),  # 128 tiles, 176 of 128x96: past a wave
        (1024, 256, 1536): (2, 2),  # K < 512: 64x128 tiles
        (1024, 1024, 1536): (11, 10),  # 96 tiles, K = 1024: 128 of 128x96
        (1024, 2048, 1536): (11, 10),  # 16 tiles along N, 8 along M: x multicast
        (1000, 2048, 1096): (11, 10),  # tests/test_fused_gpu.py's ONE_WAVE_96_X: N no multiple of 96, but K < 4096
        (1536, 2048, 1024): (5, 5),  # 11 tiles of 96 columns: the 1x2 cluster would pad
        (1152, 4096, 1152): (11, 10),  # 9 tiles along M: row 5's 2x1 cluster would pad, the 1x2 one not
        (512, 4096, 3072): (5, 5),  # 32 tiles along N against 4 along M: W multicast
        (1024, 2048, 2048): (10, 9),  # 128 tiles, 176 of 128x96: past a wave; 16 along N, 8 along M
        (256, 2048, 8192): (4, 4),  # 64 along N, 2 along M: W multicast
        (256, 8192, 8192): (4, 4),  # 128 tiles, under a wave, K >= 4096: one wave of cooperative tiles
        (1024, 8192, 2048): (10, 9),  # 16 tiles along N, 8 along M: at most twice as many
        (1000, 4096, 1160): (10, 9),  # tests/test_fused_gpu.py's ONE_WAVE_X: 80 tiles, 104 of 128x96
        (512, 8192, 4096): (4, 4),  # 32 along N, 4 along M: W multicast
        (1024, 8192, 1920): (4, 4),  # 15 along N: the 1x2 cluster would pad
        (4096, 8192, 512): (10, 9),  # 32 tiles along M, 4 along N: x multicast (v47)
        (4096, 4096, 512): (10, 9),  # K = 4096 too
        (1536, 4096, 1024): (10, 9),  # 96 tiles (128x96 would make 132, but N is not a multiple of 96)
        (1536, 8192, 1024): (10, 9),
        (1024, 8192, 1536): (11, 10),  # 96 tiles; 128 of 128x96 with N a multiple of 96, 16 along N and 8 along M
        (2048, 8192, 768): (11, 10),
        (1280, 8192, 1152): (11, 10),  # 90 tiles, 120 of 128x96
        (1536, 8192, 1152): (4, 4),  # 108 tiles, but 144 of 128x96: past a wave; 9 along N: a 1x2 cluster pads
        (384, 8192, 4096): (6, 1),  # 96 tiles, 3 along M: row 4's 2x1 cluster would pad (TF32: its stream-K row)
        (1152, 8192, 1536): (10, 9),  # 108 tiles, 9 along M: row 4's cluster would pad, the 1x2 one not
        (384, 4096, 4096): (2, 1),  # the same at K = 4096: no stream-K row there
        (4096, 2048, 512): (10, 9),  # 128 tiles at K = 2048
        (4096, 512, 512): (10, 9),  # and at K = 512
        (4096, 1024, 1024): (2, 2),  # 256 tiles, short K
        (4096, 1025, 1024): (0, 0),  # the same, K past short
        (16384, 8192, 512): (1, 1),  # N <= 1024 with K > 4096: x read half as often (TF32 128x256, 16-bit c1x2)
        (8192, 8192, 1024): (1, 1),
        (8192, 4096, 1024): (0, 0),  # K = 4096: measured at 8192 only
        (16384, 8192, 640): (0, 0),  # 5 tiles along N: row 1's would pad
        (16384, 4096, 768): (0, 0),  # the split GEMM's first N with x split before it
        (16384, 8192, 1280): (0, 0),  # N past 1024
        (16384, 2048, 512): (0, 0),  # K under 4096
        (4352, 1024, 1024): (0, 2),  # 272 tiles: past two waves; 16-bit up to 8 waves at K <= 1024
        (16384, 1024, 1024): (0, 2),  # 1024 tiles
        (4096, 1024, 4096): (0, 2),
        (4224, 1024, 4096): (0, 2),  # 1056 tiles: 8 waves
        (4352, 1024, 4096): (0, 0),  # 1088 tiles
        (16384, 512, 8192): (0, 2),  # K <= 512: 16-bit at any tile count, TF32 up to 16 waves
        (4096, 512, 8192): (2, 2),
        (65536, 512, 512): (2, 2),
        (16896, 512, 2048): (2, 2),  # 2112 tiles: 16 waves
        (17024, 512, 2048): (0, 2),  # 2128 tiles
        (1024, 4096, 4096): (0, 1),  # short M: TF32 row 0 where its 2x1 cluster pads nothing
        (1152, 4096, 4096): (1, 1),  # 9 tiles along M: it would
        (512, 4096, 8192): (2, 1),  # 256 tiles at M <= 512: TF32 64x128
        (2048, 4096, 4096): (0, 1),
        (2049, 4096, 4096): (0, 0),
        (1024, 8192, 8192): (0, 1),
        (16384, 4096, 4096): (0, 0),
        (65536, 1024, 1024): (0, 0),
    }
    # The split GEMM's stream-K row (the others take row 0): under 132 tiles with K > 1024.
    expected_rows[(1024, 65536, 1024)] = (6, 7)  # TF32 past K = 4096: the stream-K row; 16-bit the pairs
    expected_rows[(1024, 4096, 1024)] = (8, 7)
    def split_row(shape):
        M, K, N = shape
        if _tiles_128(M, N) < 132 and K > 1024:
            return 1
        return 0 if N < 768 else 3 if -(-M // 128) % 2 else 2
    # Launches without partials (eval, the training forward with its statistics from y): K <= 1024 from a wave of
    # tiles up takes row 0's tile without the statistics node (TF32 row 7, 16-bit row 6) instead of the 64x128 row or
    # row 0, on a 2x2 cluster (TF32 row 12, 16-bit row 11) at 512 < K <= 1024 with N <= 8192 from M = 8192 (16-bit:
    # 32768), from 2048 tiles or M = 65536, 16-bit also from 5120 tiles at any M, where that cluster pads nothing (v52,
    # v53, v55, v56), on a device whose DRAM peaks under 4 TB/s (an H100 SXM's 3352 GB/s; these expectations are for
    # it; v54); TF32 takes row 7 wherever it would take row 0; elsewhere the same rows.
    short_k_without_statistics = {
        (4096, 1024, 1024): (7, 6),  # 256 tiles: not the 64x128 row
        (4352, 1024, 1024): (7, 6),
        (16384, 1024, 1024): (7, 6),  # 1024 tiles: not the 2x2 cluster (a tie in TF32, a loss in bf16)
        (32640, 1024, 1024): (7, 6),  # 2040 tiles
        (32768, 1024, 1024): (12, 11),  # 2048 tiles: the 2x2 cluster
        (16384, 1024, 2048): (12, 6),  # 16-bit: M < 32768 (level to 2% behind)
        (16384, 1024, 4096): (12, 6),  # 16-bit: 4096 tiles (a tie)
        (24576, 1024, 2048): (12, 6),
        (32768, 1024, 4096): (12, 11),
        (8192, 1024, 4096): (12, 6),  # 2048 tiles: TF32 from M = 8192
        (8192, 1024, 8192): (12, 6),  # 16-bit: 4096 tiles (a tie)
        (19968, 1024, 4096): (12, 6),  # 16-bit: 4992 tiles, under its floor of 5120
        (16384, 1024, 5120): (12, 11),  # 16-bit: 5120 tiles at M < 32768
        (10240, 1024, 8192): (12, 11),
        (12288, 1024, 8192): (12, 11),
        (24576, 1024, 4096): (12, 11),
        (16384, 1024, 8192): (12, 11),  # N = 8192
        (8192, 1024, 2048): (7, 6),  # 1024 tiles
        (4096, 1024, 8192): (7, 6),  # 2048 tiles, but M < 8192
        (32768, 1024, 4352): (12, 11),  # 34 tiles along N
        (32768, 1024, 8192): (12, 11),
        (32768, 1024, 8448): (7, 6),  # N > 8192
        (32768, 1024, 256): (7, 6),  # 512 tiles (a tie in TF32, a loss in bf16)
        (65536, 1024, 256): (12, 11),  # M = 65536: the 2x2 cluster from N = 256
        (65536, 1024, 1024): (12, 11),
        (65536, 768, 1024): (12, 11),
        (65536, 1024, 2048): (12, 11),
        (131072, 1024, 512): (12, 11),
        (32900, 1000, 1000): (12, 11),  # ragged: 258 tiles along M, 8 along N
        (65536, 512, 1024): (7, 6),  # K = 512
        (65536, 1024, 2176): (7, 6),  # 17 tiles along N: the 2x2 cluster would pad
        (32896, 1024, 1024): (7, 6),  # 257 tiles along M: the 2x2 cluster would pad
        (65536, 1024, 1152): (7, 6),  # 9 tiles along N: the same
        (4096, 1024, 4096): (7, 6),
        (4224, 1024, 4096): (7, 6),
        (4352, 1024, 4096): (7, 6),
        (16384, 512, 8192): (7, 6),
        (4096, 512, 8192): (7, 6),
        (65536, 512, 512): (7, 6),
        (16896, 512, 2048): (7, 6),
        (17024, 512, 2048): (7, 6),
        (2048, 1024, 8192): (7, 6),  # 16-bit: not the 1x2-cluster row either
        (1024, 512, 2048): (10, 9),  # 128 tiles: under a wave, the one-wave row as with statistics
        (1024, 256, 1536): (2, 2),  # 96 tiles, K < 512
        (1024, 1024, 1024): (3, 3),  # 64 tiles: the small rows as with statistics
    }
    without_statistics = {shape: (7 if tf32_row == 0 else tf32_row, half_row)
                          for shape, (tf32_row, half_row) in expected_rows.items()}
    # Launches without partials past a wave from K = 2048 with M > 512 take the 256x128 row (TF32 row 9, 16-bit row 8;
    # v43, v44; 16-bit also where N <= 1024 with K > 4096: v50), except where TF32's 128x256 row would take them and
    # TF32 at N <= 1024 with K > 4096 (row 1).
    for shape in [(8192, 4096, 1024), (16384, 8192, 640), (16384, 4096, 768), (16384, 8192, 1280), (16384, 2048, 512),
                  (1024, 4096, 4096), (1152, 4096, 4096), (2048, 4096, 4096), (2049, 4096, 4096), (1024, 8192, 8192),
                  (16384, 4096, 4096), (16384, 2048, 8192), (4096, 8192, 2048)]:  # fmt: skip
        without_statistics[shape] = (9, 8)
    without_statistics.update({
        (512, 4096, 8192): (2, 1),  # M = 512: two 256-row tiles
        (640, 4096, 4096): (9, 8),  # 160 tiles, M > 512 (with partials TF32 takes the 128x256 row here)
        (16384, 1536, 4096): (7, 0),  # K < 2048
        (16384, 8192, 512): (1, 8),  # N <= 1024 with K > 4096: TF32 row 1, 16-bit the 256x128 row
        (8192, 8192, 1024): (1, 8),
        (1024, 2048, 2048): (10, 9),  # 128 tiles: the one-wave row
    })  # fmt: skip
    # The device fact: the 2x2 cluster only under 4 TB/s of DRAM; an H200 (4915 GB/s), a device at the bound and one
    # whose bandwidth is unknown (0; also what the default, the current device, reads without a GPU) take row 0's
    # tile alone there. Checked at both sides of the bound so a flipped comparison fails.
    tall_row, plain_tall_row = (12, 7) if tf32 else (11, 6)
    plain_launches = {**without_statistics, **short_k_without_statistics}
    clause_taken = 0  # launches the fact moved (so the check can fail)
    for dram_gbps in (3352, 3999, 4000, 4915, 0):
        slow_dram = 0 < dram_gbps < 4000
        for (M, K, N), (tf32_row, half_row) in plain_launches.items():
            expected = split_row((M, K, N)) if split else tf32_row if tf32 else half_row
            if expected == tall_row and not split and not slow_dram:
                expected = plain_tall_row
            clause_taken += expected == tall_row and not split
            chosen = debug.gemm_selected_config(dtype, M, N, K, split, statistics=False, dram_gbps=dram_gbps)
            assert chosen == expected, (M, K, N, dram_gbps)
    assert clause_taken == (0 if split else 2 * 21 if tf32 else 2 * 15)  # the dict's tall rows, at 3352 and 3999
    current_dram = debug.device_dram_gbps()  # 0 without a CUDA device
    for M, K, N in plain_launches:
        expected = debug.gemm_selected_config(dtype, M, N, K, split, statistics=False, dram_gbps=current_dram)
        assert debug.gemm_selected_config(dtype, M, N, K, split, statistics=False) == expected, (M, K, N)
        plain_row = (rows[expected]["partial_rows"], rows[expected]["tile_n"])
        assert debug.gemm_config(dtype, M, N, K, -1, split, statistics=False) == plain_row, (M, K, N)
    with pytest.raises(RuntimeError, match="dram_gbps = -2"):
        debug.gemm_selected_config(dtype, 65536, 1024, 1024, split, statistics=False, dram_gbps=-2)
    # Launches with partials: TF32 past 2048 tiles with K >= 4096, where the rows above would take row 0 and the 256x128
    # tile's 1x2 cluster pads nothing, takes row 13 (the node merged once per tile) on a device under 4 TB/s of DRAM
    # (v60); the dict's rows are an H200's (4915 GB/s) and an unknown device's.
    wide_node_shapes = {(16384, 4096, 4096), (16512, 4096, 2048), (65536, 8192, 4096), (32768, 4096, 8192)}
    expected_rows.update({
        (16512, 4096, 2048): (0, 0),  # 2064 tiles (129 ragged 128-row tiles along M)
        (16384, 4096, 2048): (0, 0),  # 2048 tiles: the y pass's domain (train_statistics_from_y)
        (16384, 2048, 8192): (0, 0),  # K < 4096
        (65536, 8192, 4096): (0, 0),
        (32768, 4096, 8192): (0, 0),
        (32768, 4096, 4224): (0, 0),  # 33 tiles along N: the 1x2 cluster would pad
    })  # fmt: skip
    wide_node_taken = 0  # launches the clause moved (so the check can fail)
    for dram_gbps in (3352, 3999, 4000, 4915, 0):
        for (M, K, N), (tf32_row, half_row) in expected_rows.items():
            expected = split_row((M, K, N)) if split else tf32_row if tf32 else half_row
            if tf32 and (M, K, N) in wide_node_shapes and 0 < dram_gbps < 4000:
                expected = 13
            wide_node_taken += expected == 13
            assert debug.gemm_selected_config(dtype, M, N, K, split, dram_gbps=dram_gbps) == expected, (M, K, N)
    assert wide_node_taken == (2 * len(wide_node_shapes) if tf32 else 0)  # at 3352 and 3999
    for M, K, N in expected_rows:  # the current device (without a GPU: unknown, 0)
        expected = debug.gemm_selected_config(dtype, M, N, K, split, dram_gbps=current_dram)
        assert debug.gemm_selected_config(dtype, M, N, K, split) == expected, (M, K, N)
        assert debug.gemm_config(dtype, M, N, K, -1, split) == (rows[expected]["partial_rows"], rows[expected]["tile_n"])


def test_stream_k_split_rule():
    # configs.h select_splits: where the 128x128 tiles fill more than a quarter and at most half of a 132-SM wave,
    # split-K 3 while 3 x tiles stay within the wave (34..44 tiles, v29) and split-K 2 past that (45..66: 64
    # measured, the dW GEMM at 1024x1024), else 1 (CUTLASS's stream-K heuristic).
    tiles_to_splits = {16: 1, 33: 1, 34: 3, 40: 3, 44: 3, 45: 2, 64: 2, 66: 2, 67: 1, 128: 1, 1024: 1}
    for tiles, splits in tiles_to_splits.items():
        assert debug.gemm_selected_splits(128 * tiles, 128) == splits, tiles
        assert debug.gemm_selected_splits(128, 128 * tiles) == splits, tiles
    assert debug.gemm_selected_splits(1024, 1024) == 2  # 8 x 8 tiles
    assert debug.gemm_selected_splits(1000, 1000) == 2  # ragged: still 8 x 8
    with pytest.raises(RuntimeError, match="M = 0"):
        debug.gemm_selected_splits(0, 128)


def test_single_kernels_refuse_host_tensors():
    # The operators check every tensor before any CUDA call, so host tensors are refused even where no GPU is
    # (the GPU tests check the launches and the other refusals).
    torch = pytest.importorskip("torch")
    M, K, N = 8, 16, 16
    x, w, y = torch.rand(M, K), torch.rand(N, K), torch.rand(M, N)
    partials, save = torch.rand(2, 1, N), torch.rand(N)
    with pytest.raises(RuntimeError, match="gemmbn: x must be a CUDA tensor"):
        debug.gemm_scale_stats(x, w, y, None, None, None, None, partials[0], partials[1], None)
    with pytest.raises(RuntimeError, match="gemmbn: y must be a CUDA tensor"):
        debug.finish_normalize(y, y, partials[0], partials[1], 1, None, None, None, None, None, 0.1, 1e-5, save, save)


def test_statistics_source_override(monkeypatch):
    """GEMMBN_STATISTICS_SOURCE forces either source whatever the rule says (the tests and perf/statistics_source.py
    run both through it); the rule's own choices are checked in test_statistics_source_rule."""
    for dtype, split in (("bfloat16", False), ("float32", False), ("float32", True)):
        monkeypatch.setenv("GEMMBN_STATISTICS_SOURCE", "y")
        assert debug.train_statistics_from_y(dtype, 16384, 8192, 512, split)
        assert debug.train_statistics_from_y(dtype, 128, 512, 4096, split)
        monkeypatch.setenv("GEMMBN_STATISTICS_SOURCE", "epilogue")
        assert not debug.train_statistics_from_y(dtype, 16384, 8192, 512, split)


@pytest.mark.torch_agnostic  # the rule's switches, read in C++; ~45 s of fresh processes
def test_row_overrides_take_their_own_launches_only():
    """GEMMBN_PLAIN_ROW / GEMMBN_STATISTICS_ROW (read once per process, so checked in fresh ones): a row of a table
    without / with the statistics node (and without stream-K) replaces that table's rule for launches without / with
    partials past the small and one-wave rows; the other launches, those rows, the split GEMM and tables without such a
    row keep the rule."""
    # Past a wave (16384x4096->4096, 4096x1024->1024), small (128x1024->512) and one wave (1024x4096->1024, 64 tiles).
    shapes = [(16384, 4096, 4096), (4096, 1024, 1024), (128, 1024, 512), (1024, 4096, 1024)]
    launches = [(dtype, split, statistics, shape) for dtype, split in (("bfloat16", False), ("float32", False),
                ("float32", True)) for statistics in (True, False) for shape in shapes]  # fmt: skip
    probe = ("import json; from gemmbn import debug; print(json.dumps([debug.gemm_selected_config(d, M, N, K, split, "
             f"statistics) for d, split, statistics, (M, K, N) in {launches}]))")
    def selected(variable: str, value: str) -> list[int]:
        env = {**os.environ, "GEMMBN_PLAIN_ROW": "", "GEMMBN_STATISTICS_ROW": "", variable: value}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), os.environ.get("PYTHONPATH")]))
        ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
        assert ran.returncode == 0, ran.stderr
        return json.loads(ran.stdout)
    def rows(dtype: str, statistics: bool) -> set[int]:
        return {i for i, r in enumerate(debug.gemm_configs(dtype)) if bool(r["statistics"]) == statistics
                and not r["stream_k"]}  # fmt: skip
    stream_k = {i for i, r in enumerate(debug.gemm_configs("float32")) if r["stream_k"]}
    eligible, values = {}, {}
    for variable, statistics in (("GEMMBN_PLAIN_ROW", False), ("GEMMBN_STATISTICS_ROW", True)):
        eligible[variable] = {dtype: rows(dtype, statistics) for dtype in ("bfloat16", "float32")}
        others = rows("bfloat16", not statistics) | rows("float32", not statistics) | stream_k
        values[variable] = sorted(set().union(*eligible[variable].values(), others, {99}))  # 99: no row
    # The ~40 processes, each mostly torch's import, a worker per core: half the test's time on CI's two cores.
    runs = [("GEMMBN_PLAIN_ROW", "")] + [(variable, str(v)) for variable in values for v in values[variable]]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        found = dict(zip(runs, pool.map(lambda run: selected(*run), runs)))
    rule = found[("GEMMBN_PLAIN_ROW", "")]
    assert rule == [debug.gemm_selected_config(d, M, N, K, split, st) for d, split, st, (M, K, N) in launches]
    for variable, statistics in (("GEMMBN_PLAIN_ROW", False), ("GEMMBN_STATISTICS_ROW", True)):
        overridden = 0  # launches an override moved off the rule's row (so the check can fail)
        for value in values[variable]:
            expected = [value if not split and st == statistics and value in eligible[variable][dtype]
                        and _tiles_128(M, N) >= 132 else by_rule
                        for (dtype, split, st, (M, K, N)), by_rule in zip(launches, rule)]  # fmt: skip
            assert found[(variable, str(value))] == expected, (variable, value)
            overridden += sum(e != r for e, r in zip(expected, rule))
        assert overridden > 0, variable


def test_statistics_source_rule(monkeypatch):
    """gemm_dispatch.cpp's rule: finish_normalize's pass over y past a wave (132) of 128x128 tiles for K <= 1024, and
    in 16-bit for K <= 2048, unless its GEMM's grid spans at most three waves and more tile area in waves than the
    epilogue's (64x128 tiles there); TF32 at K > 4096 on the cooperative 128x256 row; the cooperative 256x128 row
    against row 0 with the node from a wave up to 2048 tiles (16-bit from K = 2048, TF32 from K = 4096); never for the
    split GEMM; the epilogue elsewhere (perf/NOTES.md v17, v22, v24, v25, v26, v43 and v44 have the measurements)."""
    monkeypatch.delenv("GEMMBN_STATISTICS_SOURCE", raising=False)
    from_y = {  # (M, K, N) -> the y pass?  (tiles)
        (16384, 512, 8192): True,  # 8192
        (4096, 512, 8192): True,  # 2048
        (65536, 512, 512): True,  # 2048
        (65536, 1024, 1024): True,  # 4096
        (16384, 1024, 1024): True,  # 1024
        (4096, 1024, 1024): True,  # 256: TF32 0.057 -> 0.048 ms with the row without the statistics node
        (2048, 1024, 1024): False,  # 128 tiles: under a wave the y pass lost by 7-28%
        (4224, 1024, 512): False,  # 33 x 4 = 132 tiles: a wave, not past it
        (4352, 1024, 512): False,  # 34 x 4 = 136 tiles: 2 waves against the 64x128 grid's 1.5 (272 of them)
        (4224, 1024, 1024): False,  # 264 tiles, 272 with the cluster: 3 waves against 2 (v25: y pass 1.03-1.09x)
        (4352, 1024, 1024): (True, False),  # TF32's epilogue runs 128x128 too (0.84x); 16-bit's 64x128: 3 against 2.5
        (2176, 1024, 2048): (True, False),  # the same at N = 2048 (TF32 0.85x, bf16 1.04x)
        (1152, 1024, 2048): False,  # 144 tiles (160 with the cluster): 2 waves against 1.5 (1.15x)
        (3328, 1024, 2048): True,  # 416 tiles: 4 waves against 3.5 in 16-bit, and the y pass still wins (bf16 0.93x)
        (8576, 1024, 1024): True,  # 544 tiles: 5 against 4.5 (bf16 0.97x)
        (5248, 1024, 2048): True,  # 672 tiles: 6 against 5 (bf16 0.95-0.97x)
        (2048, 2048, 1024): False,  # 128 tiles, K = 2048
        (4352, 2048, 512): True,  # 136 tiles: the 256x128 row's y pass from K = 2048 (below)
        (3072, 2048, 1024): True,  # 192 tiles: bf16 0.053 -> 0.046 ms
        (4096, 2048, 8192): True,  # 2048 tiles: bf16 0.253 vs 0.264 ms; TF32 5-6% faster (v46, H100)
        (16384, 2048, 8192): (False, True),  # 8192 tiles: TF32's y pass 4-7% slower (v46); 16-bit's short-K clause
        # From K = 2048 and a wave up to 2048 tiles: row 0 with the node against the 256x128 row without it and the y
        # pass (v43, H100: the 16-bit training forward 5-12% faster; v44, v46: TF32 1-10% from K = 4096, 5-6% at
        # K = 2048 once that row had 4 stages); past 2048 tiles level (+-4%), so the node. Where the launch with
        # partials takes row 0: in 16-bit M > 2048 (below, the 1x2-cluster row keeps its node), in TF32 M > 512 unless
        # M <= 2048 with a padded 2x1 cluster.
        (16384, 2049, 8192): False,  # 8192 tiles
        (16384, 4096, 4096): False,  # 4096 tiles: the y pass by run bf16 -3.7% to +1.4% (v43), TF32 -1.5% to +6.3%
        (65536, 4096, 4096): False,
        (16384, 8192, 4096): False,
        (8192, 4096, 4096): True,  # 2048 tiles
        (8320, 4096, 4096): False,  # 2080 tiles
        (2304, 4096, 4096): True,
        (2048, 4096, 4096): (True, False),  # 16-bit's 1x2-cluster row keeps its node up to M = 2048; TF32 row 0
        (1152, 4096, 4096): False,  # TF32's 128x256 row (a 2x1 cluster would pad) keeps its node
        (1024, 4096, 4096): (True, False),  # v43: bf16's y pass 1.5% slower here; v44: TF32's 3.5% faster
        (640, 4096, 8192): False,  # 320 tiles, M = 640: TF32's 128x256 row again
        (512, 4096, 8192): False,  # M = 512: the 64x128 row
        # K > 4096: TF32's cooperative 128x256 row (N <= 1024) exposes its epilogue; the y pass 0.95-0.99x (v26)
        (16384, 8192, 512): (True, False),  # 512 tiles: TF32 0.97x, bf16 1.01x
        (8192, 8192, 1024): (True, False),
        (6144, 8192, 512): (True, False),  # 192 tiles
        (8192, 16384, 1024): (True, False),
        (4096, 8192, 512): False,  # 128 tiles: a one-wave row (TF32 1.035x)
        (16384, 8192, 2048): True,  # v26 (H200) TF32 on row 7: 1.01x; v44 (H100) on row 9: 0.89-0.92x
        (4096, 4096, 1024): True,  # K = 4096 is not past it: the 256x128 row above
    }
    for (M, K, N), expected in from_y.items():
        tf32_expected, half_expected = expected if isinstance(expected, tuple) else (expected, expected)
        for dtype in ("float32", "bfloat16", "float16"):
            want = tf32_expected if dtype == "float32" else half_expected
            assert debug.train_statistics_from_y(dtype, M, N, K) == want, (dtype, M, K, N)
        assert not debug.train_statistics_from_y("float32", M, N, K, split=True), (M, K, N)


def test_cublas_product_rule(monkeypatch):
    """gemm_dispatch.cpp's rule for the training forward's product: in a build with CMake GEMMBN_CUBLAS_PRODUCT,
    cuBLAS's in 16-bit at K > 4096 from 256 to 2048 tiles of 128x128 (perf/NOTES.md v28's grid), gemmbn's elsewhere and
    always in float32, GEMMBN_TRAIN_PRODUCT forcing either in 16-bit only; in any other build, gemmbn's always."""
    monkeypatch.setenv("GEMMBN_TRAIN_PRODUCT", "cublas")
    built = debug.train_product_by_cublas("bfloat16", 16384, 512, 8192)
    monkeypatch.delenv("GEMMBN_TRAIN_PRODUCT")
    cublas = {  # (M, K, N) -> cuBLAS's product in 16-bit?  (tiles)
        (16384, 8192, 512): True,  # 512
        (4096, 8192, 2048): True,  # 512
        (512, 8192, 8192): True,  # 256
        (16384, 8192, 2048): True,  # 2048
        (4096, 8192, 8192): True,  # 2048
        (4096, 8192, 512): False,  # 128: the y pass's fixed cost (1.14x)
        (256, 8192, 8192): False,  # 128
        (16384, 8192, 4096): False,  # 4096: cuBLAS's kernel there lost (1.05x)
        (16384, 4096, 4096): False,  # K = 4096
        (4096, 4096, 8192): False,
        (4096, 2048, 8192): False,
    }
    for (M, K, N), expected in cublas.items():
        for dtype in ("bfloat16", "float16"):
            assert debug.train_product_by_cublas(dtype, M, N, K) == (expected and built), (dtype, M, K, N)
        assert not debug.train_product_by_cublas("float32", M, N, K), (M, K, N)
    for forced, expected in (("cublas", True), ("gemmbn", False)):
        monkeypatch.setenv("GEMMBN_TRAIN_PRODUCT", forced)
        for M, K, N in ((128, 512, 264), (16384, 8192, 512)):
            assert debug.train_product_by_cublas("bfloat16", M, N, K) == (expected and built)
            assert not debug.train_product_by_cublas("float32", M, N, K)


def test_the_native_clock_is_pythons_monotonic_clock():
    """host_mark_ns (perf/host_overhead.py --mark) is compared with time.clock_gettime_ns(CLOCK_MONOTONIC): the
    native reading lies between two Python readings around it; in a CPU process no mark has been passed, and an
    unknown mark is refused."""
    import time

    for _ in range(100):
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        native = debug.monotonic_ns()
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        assert before <= native <= after
    if not torch.cuda.is_available():
        assert [debug.host_mark_ns(mark) for mark in debug.HOST_MARKS] == [0, 0, 0]
    with pytest.raises(ValueError, match="mark must be one of"):
        debug.host_mark_ns("gemm")


def _tiles_128(M: int, N: int) -> int:
    """128x128 output tiles of an M x N problem, the count select_config's rule reads."""
    return -(-M // 128) * -(-N // 128)


def _padded_tiles(row: dict, M: int, N: int, swizzle: int) -> int:
    """Tiles CUTLASS's persistent scheduler walks for an M x N output: each grid dimension rounded up to a multiple of
    swizzle x the cluster's extent along it (tile_scheduler_params.h), written out here independently of configs.h."""
    tiles_m, tiles_n = -(-M // row["tile_m"]), -(-N // row["tile_n"])
    step_m, step_n = swizzle * row["cluster_m"], swizzle * row["cluster_n"]
    return -(-tiles_m // step_m) * step_m * (-(-tiles_n // step_n) * step_n)


@pytest.mark.parametrize("dtype,split", TABLES, ids=TABLE_IDS)
def test_the_launch_swizzle_is_the_largest_that_pads_no_tile(dtype, split):
    """The swizzle a launch passes: the table's, halved until the tile grid is no larger than at swizzle 1 (a padded
    tile takes a CTA's turn for nothing: perf/NOTES.md v19). Shapes from the sweep's short-M and small-N rows, where
    the clustered rows padded, and ragged ones."""
    for index, table_row in enumerate(debug.gemm_configs(dtype, split)):
        for M, N in ((256, 8192), (1024, 8192), (16384, 512), (4096, 512), (128, 1024), (1000, 264), (16384, 4096),
                     (65536, 1024), (384, 8192), (2176, 6144)):  # fmt: skip
            launch = debug.gemm_launch_config(dtype, M, N, 1024, index, split)
            assert {k: v for k, v in launch.items() if k != "swizzle"} == \
                   {k: v for k, v in table_row.items() if k != "swizzle"}  # fmt: skip
            expected = max(s for s in (1, 2, 4, 8) if s <= table_row["swizzle"]
                           and _padded_tiles(table_row, M, N, s) == _padded_tiles(table_row, M, N, 1))  # fmt: skip
            assert launch["swizzle"] == expected, (index, M, N)
    # The cases that measured the rule: the c2x1 rows at 256 rows, the c1x2 row at 512 columns.
    if dtype == "bfloat16":
        bf16 = debug.gemm_configs("bfloat16")
        assert bf16[0]["cluster_m"] == 2 and debug.gemm_launch_config(dtype, 256, 8192, 8192, 0)["swizzle"] == 1
        assert bf16[1]["cluster_n"] == 2 and debug.gemm_launch_config(dtype, 16384, 512, 8192, 1)["swizzle"] == 2
