"""Named shape sets for perf/bench.py, kept apart from the test shapes.

Each shape is (M, K, N): x [M, K] @ W[N, K]^T -> out [M, N].
"""

from __future__ import annotations

from typing import NamedTuple


class Shape(NamedTuple):
    M: int
    K: int
    N: int

    def label(self) -> str:
        return f"{self.M}x{self.K}->{self.N}"

    def flops(self) -> int:
        return 2 * self.M * self.N * self.K


def _sweep() -> list[Shape]:
    """20 shapes: M in powers of 4 from 256 to 65536 against square K=N, plus off-square K/N.

    Sparse on purpose: the full cross (5 M x 5 K x 5 N) would cost hours of torch.compile time.
    """
    shapes = [Shape(M, KN, KN) for KN in (1024, 4096) for M in (256, 1024, 4096, 16384, 65536)]
    shapes += [Shape(M, K, N) for M in (4096, 16384) for K, N in ((512, 8192), (8192, 512), (2048, 8192), (8192, 2048))]
    shapes += [Shape(65536, 512, 512), Shape(256, 8192, 8192)]  # tall-narrow and short-wide extremes
    # Largest first: when bench.py --max-minutes cuts torch.compile short, the small shapes lose it.
    return sorted(shapes, key=lambda s: (s.flops(), s), reverse=True)


SETS: dict[str, list[Shape]] = {
    "kernelbench": [Shape(16384, 4096, 4096)],  # KernelBench's problem size
    "large_n": [Shape(1024, 8192, 8192)],
    "tiny": [Shape(128, 1024, 512)],
    "sweep": _sweep(),
    # The sweep's ten smallest shapes, for a process of their own: timed last in a whole sweep, their torch.compile
    # times were 2-3x eager's at some shapes in three runs (perf/NOTES.md v21, v23, v24).
    "sweep_small": _sweep()[10:],
    # Issue 17's synchronized single-call latency shapes (bench.py --sync): host-bound to GEMM-bound.
    "latency": [Shape(128, 1024, 512), Shape(4096, 1024, 1024), Shape(1024, 8192, 8192), Shape(16384, 4096, 4096)],
    # Short K, where the statistics epilogue costs most (select_config's short-K clauses; all in the sweep too).
    "short_k": [Shape(16384, 512, 8192), Shape(4096, 512, 8192), Shape(65536, 512, 512), Shape(16384, 1024, 1024)],
    # Long K under one wave of 128x128 tiles (select_config's one-wave rows; two of them in the sweep too): 128x128
    # tiles, then 128x96 ones (N a multiple of 96), then K = 4096.
    "long_k": [Shape(256, 8192, 8192), Shape(4096, 8192, 512), Shape(1024, 8192, 2048), Shape(512, 8192, 4096),
               Shape(1536, 8192, 1024), Shape(1024, 8192, 1536), Shape(2048, 8192, 768), Shape(1536, 4096, 1024)],
}
ALL_ORDER = ("kernelbench", "large_n", "tiny", "sweep")


def parse_sizes(spec: str) -> list[Shape]:
    """Shapes from the perf tools' --sizes text, "M K N;M K N;..." (empty entries ignored)."""
    try:
        return [Shape(*(int(v) for v in size.split())) for size in spec.split(";") if size.strip()]
    except (TypeError, ValueError):
        raise ValueError(f'--sizes wants "M K N;M K N;...", got {spec!r}') from None


def resolve(spec: str) -> list[tuple[str, Shape]]:
    """(set name, shape) pairs for a comma-separated list of set names, or "all"."""
    names = ALL_ORDER if spec == "all" else tuple(name.strip() for name in spec.split(","))
    unknown = [name for name in names if name not in SETS]
    if unknown:
        raise ValueError(f"unknown shape set(s) {unknown}; choose from {sorted(SETS)} or 'all'")
    return [(name, shape) for name in names for shape in SETS[name]]
