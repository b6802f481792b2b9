"""finish_normalize's and fold_eval_affine's device code executed on the CPU, so CI (no GPU) runs their logic.

tests/emulation/finish_normalize_emulated.cpp compiles kernels/src/finish_normalize.cu with the emulation
shim (tests/_emulation.py) and checks every phase against float64 for float32, bfloat16 and float16, with the
partials given (the GEMM epilogue's), made by the kernel's own pass over y (whose phase 2 walks rows last first) and
by the product variant's (y = (v + b) s formed from cuBLAS's x W^T, the kept y written back), with phase 2's
items claimed from a counter instead of walked statically, and through the dataflow walk while a thread plays the
GEMM counting its stored tiles (jobs first, the tiles along N; items first, the tiles along M, where an item must stream
before the GEMM's last column tile); and fold_eval_affine;
the bounds and their reasons are in that file.
"""

from _emulation import ROOT, build_and_run, cooperative_source, kernels_only


def test_finish_normalize_on_the_cpu(tmp_path):
    sources = {
        "finish_normalize_source.cpp": cooperative_source(ROOT / "kernels" / "src" / "finish_normalize.cu"),
        "fold_eval_affine_source.cpp": kernels_only(ROOT / "kernels" / "src" / "fold_eval_affine.cu"),
    }
    build_and_run(tmp_path, "finish_normalize_emulated.cpp", sources, expected_cases=3 + 6 * 7 * 3)  # fold x 3 dtypes; 6 cases x 7 sources x 3 dtypes
