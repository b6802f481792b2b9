"""batch_norm_backward's device code executed on the CPU, so CI (no GPU) runs its three phases.

tests/emulation/batch_norm_backward_emulated.cpp compiles kernels/src/batch_norm_backward.cu with the
emulation shim (tests/_emulation.py) and checks dbeta, dgamma, sum_grad_y and grad_y against float64 for
float32, bfloat16 and float16: batch and fixed statistics, ragged shapes, a mean 1e3 times the spread,
more column stripes than blocks; and weight_grads' kernel (kernels/src/weight_grads.cu). The bounds and
their reasons are in that file.
"""

from _emulation import ROOT, build_and_run, cooperative_source, kernels_only

KERNELS = ROOT / "kernels" / "src"


def test_batch_norm_backward_on_the_cpu(tmp_path):
    sources = {"batch_norm_backward_source.cpp": cooperative_source(KERNELS / "batch_norm_backward.cu"),
               "weight_grads_source.cpp": kernels_only(KERNELS / "weight_grads.cu")}  # fmt: skip
    build_and_run(tmp_path, "batch_norm_backward_emulated.cpp", sources, expected_cases=3 + 8 * 3)
