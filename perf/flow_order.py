"""What the GEMM's tile order leaves the dataflow walk to overlap: a CPU model, no GPU needed.

    PYTHONPATH=python python perf/flow_order.py [--sizes "M K N;..."] [--dtype bfloat16|tf32] [--orders H,M1,M8,N8]

The persistent GEMM walks its tiles in CUTLASS's order (kernel/sm90_tile_scheduler.hpp, get_work_idx_m_and_n:
clusters along the minor dimension in groups of `swizzle`, then along the major one, then the next group; AlongN's
major dimension is N, AlongM's is M; the heuristic takes AlongM where N has more tiles). CTA c takes tiles c, c + G,
c + 2G, ... (G CTAs, one per SM); the model counts every tile as one unit of time. Per order it prints:
- waves: tiles / G, and the SM-time the last partial wave leaves idle (the walk's room to run beside the GEMM);
- early: the fraction of y's columns whose column tiles are all stored before the last wave starts (what the walk with
  items first, GEMMBN_FLOW_ITEMS_FIRST=1, can normalize in that room; perf/NOTES.md v35);
- per wave: the distinct row tiles and column tiles one wave of G tiles touches (its operand footprint in L2, in
  tiles of x and of W: a proxy for what the order costs the GEMM, which only a GPU measures).
The row (tile and cluster shape, its swizzle) is the one select_config picks (gemmbn.debug; the native library runs on
the CPU for this), else --tile/--cluster.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import SETS, parse_sizes  # noqa: E402

SMS = 132  # an H100 SXM / H200


def tile_order(tiles_m: int, tiles_n: int, cluster_m: int, cluster_n: int, raster: str, swizzle: int):
    """CUTLASS's persistent order: the (m, n) of each linear tile index, over the grid padded as CUTLASS pads it."""
    log = 3 if swizzle >= 8 and min(tiles_m, tiles_n) >= 6 else 2 if swizzle >= 4 and min(tiles_m, tiles_n) >= 3 else \
        1 if swizzle >= 2 and min(tiles_m, tiles_n) >= 2 else 0  # fmt: skip
    group = 1 << log
    blocks_m = math.ceil(tiles_m / (group * cluster_m)) * group * cluster_m
    blocks_n = math.ceil(tiles_n / (group * cluster_n)) * group * cluster_n
    if raster == "H":
        raster = "M" if blocks_n > blocks_m else "N"
    major_cluster, minor_cluster = (cluster_n, cluster_m) if raster == "N" else (cluster_m, cluster_n)
    clusters_major = (blocks_n if raster == "N" else blocks_m) // major_cluster
    order = []
    for linear in range(blocks_m * blocks_n):
        # The lowest digits: the CTA's place in its cluster along the minor dimension, then along the major one.
        block, minor_offset = divmod(linear, minor_cluster)
        cluster_id, major_offset = divmod(block, major_cluster)
        offset, extra = cluster_id % group, cluster_id // group
        minor_group, cluster_major = divmod(extra, clusters_major)
        minor = (minor_group * group + offset) * minor_cluster + minor_offset
        major = cluster_major * major_cluster + major_offset
        order.append((minor, major) if raster == "N" else (major, minor))
    return order, raster, group


def model(M: int, N: int, tile_m: int, tile_n: int, cluster_m: int, cluster_n: int, raster: str, swizzle: int):
    tiles_m, tiles_n = math.ceil(M / tile_m), math.ceil(N / tile_n)
    order, taken, group = tile_order(tiles_m, tiles_n, cluster_m, cluster_n, raster, swizzle)
    G = min(SMS // (cluster_m * cluster_n) * cluster_m * cluster_n, len(order))
    done = [0] * tiles_n  # the time each column tile's last tile is stored
    for i, (m, n) in enumerate(order):
        if m < tiles_m and n < tiles_n:
            done[n] = max(done[n], i // G + 1)
    waves = math.ceil(len(order) / G)
    early_columns = sum(min(tile_n, N - n * tile_n) for n in range(tiles_n) if done[n] <= waves - 1)
    first = order[:G]
    return {
        "order": f"{taken}{group}",
        "waves": len(order) / G,
        "idle": waves - len(order) / G,
        "early": early_columns / N,
        "rows": len({m for m, _ in first}),
        "columns": len({n for _, n in first}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", help='"M K N;M K N" (default: the sweep)')
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "tf32"))
    parser.add_argument("--orders", default="H,M1,M2,M4,M8", help="H (the row's: CUTLASS's heuristic), M<s>, N<s>")
    parser.add_argument("--tile", help="tile_m,tile_n instead of the chosen row's")
    parser.add_argument("--cluster", default="1,1", help="cluster_m,cluster_n with --tile")
    args = parser.parse_args()
    shapes = parse_sizes(args.sizes) if args.sizes else SETS["sweep"]
    print("M×K→N | row (tile, cluster, swizzle) | order | waves | idle SM-waves | early columns | rows, columns "
          "per wave")
    for shape in shapes:
        if args.tile:
            tile_m, tile_n = map(int, args.tile.split(","))
            cluster_m, cluster_n = map(int, args.cluster.split(","))
            swizzle, label = 8, f"{tile_m}x{tile_n} c{cluster_m}x{cluster_n}"
        else:
            from gemmbn import debug

            row = debug.gemm_launch_config("float32" if args.dtype == "tf32" else args.dtype, shape.M, shape.N,
                                           shape.K)  # fmt: skip
            tile_m, tile_n, cluster_m, cluster_n, swizzle = (row[k] for k in ("tile_m", "tile_n", "cluster_m",
                                                                                "cluster_n", "swizzle"))  # fmt: skip
            label = f"{tile_m}x{tile_n} c{cluster_m}x{cluster_n} s{swizzle}"
        for spec in args.orders.split(","):
            raster, order_swizzle = spec[0], int(spec[1:]) if len(spec) > 1 else swizzle
            r = model(shape.M, shape.N, tile_m, tile_n, cluster_m, cluster_n, raster, order_swizzle)
            print(f"{shape.M}×{shape.K}→{shape.N} | {label} | {spec}: {r['order']} | {r['waves']:.2f} | "
                  f"{r['idle']:.2f} | {r['early']:.0%} | {r['rows']}, {r['columns']}")  # fmt: skip


if __name__ == "__main__":
    main()
