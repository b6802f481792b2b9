"""finish_normalize's and fold_eval_affine's device code executed on the CPU, so CI (no GPU) runs their logic.

tests/emulation/finish_normalize_emulated.cpp compiles kernels/src/finish_normalize.cu with the emulation shim
(tests/_emulation.py) and checks every phase against float64 for float32, bfloat16 and float16, with the partials
given (the GEMM epilogue's), made by the kernel's own pass over y (whose phase 2 walks rows last first) and by the
product variant's (y = (v + b) s formed from cuBLAS's x W^T, the kept y written back), with phase 2's items claimed
from a counter instead of walked statically (the y pass's too: passes, last passes first, all or half), and through
the dataflow walk while a thread plays the GEMM counting its stored tiles (jobs first, the tiles along N; items first,
the tiles along M, where an item must stream before the GEMM's last column tile), as one block and as three at once (a
process each), and through the local walk (each block merging its own stripe's statistics, no grid barrier), as one
block per item run last item first (normalizing y in place where the launch would take that walk so, which then writes
a stripe's last rows before its other blocks merge) and as three at once; and fold_eval_affine; the bounds and their
reasons are in that file. Each in both builds of the GEMM's partials of a ragged last row block (made by the GEMM, or
read from y by the finish). The same binary then runs the walk beside a GEMM that never stores one tile: the walk must
give up (the GPU traps) rather than wait forever.
"""

import subprocess

import pytest
from _emulation import ROOT, build, cooperative_source, kernels_only, run_cases

pytestmark = pytest.mark.torch_agnostic  # C++ drivers built apart: no torch code runs

FLOW_GAVE_UP_EXIT = 86  # tile_flow.h kFlowGaveUpExit: the emulated walk's exit where the GPU's traps


# Both builds of CMake's GEMMBN_RAGGED_TILE_FROM_Y: the GEMM's partials of every row block (OFF), and of its
# full row blocks only, the finish reading the ragged last one's rows from y (the default, api.h kRaggedTileFromY);
# there the driver poisons the ragged row block's partials, so a read of them fails the cases.
@pytest.fixture(scope="module", params=[0, 1], ids=["ragged-tile-partials", "ragged-tile-from-y"])
def finish_driver(tmp_path_factory, request):
    sources = {
        "finish_normalize_source.cpp": cooperative_source(ROOT / "kernels" / "src" / "finish_normalize.cu"),
        "fold_eval_affine_source.cpp": kernels_only(ROOT / "kernels" / "src" / "fold_eval_affine.cu"),
    }
    return build(tmp_path_factory.mktemp("finish"), "finish_normalize_emulated.cpp", sources,
                 defines={"GEMMBN_RAGGED_TILE_FROM_Y": request.param})


def test_finish_normalize_on_the_cpu(finish_driver):
    # fold x 3 dtypes; 8 cases x 13 sources x 3 dtypes, shared by a process per core (CI has two)
    run_cases(finish_driver, expected_cases=3 + 8 * 13 * 3, shards=4)


@pytest.mark.parametrize("first", ["jobs", "items"])
def test_dataflow_walk_gives_up_on_a_tile_never_stored(finish_driver, first):
    # The driver's walk waits 0.2 s at most for the missing tile; 60 s covers a loaded CI machine, far from a hang.
    ran = subprocess.run([str(finish_driver), "gives-up", first], capture_output=True, text=True, timeout=60)
    assert ran.returncode == FLOW_GAVE_UP_EXIT, (ran.returncode, ran.stdout[-2000:], ran.stderr[-2000:])
    assert "waited past its limit" in ran.stdout and "GEMMBN_FINISH_DATAFLOW=0" in ran.stdout, ran.stdout[-2000:]
