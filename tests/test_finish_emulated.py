"""finish_normalize's and fold_eval_affine's device code executed on the CPU, so CI (no GPU) runs their logic.

tests/emulation/emulation.h turns the CUDA qualifiers into plain C++ and runs one thread block as 256
std::threads (__syncthreads a barrier, the cooperative grid's sync the block's: a grid of one block that
walks every work item). tests/emulation/finish_normalize_emulated.cpp compiles kernels/src/finish_normalize.cu
with it (its cooperative_groups include swapped for the shim) and checks every phase against float64
for float32, bfloat16 and float16, and fold_eval_affine; the bounds and their reasons are in that file. This checks indexing, counts and arithmetic,
not what only a GPU shows (races between blocks, warp behaviour, speed): tests/test_native_gpu.py does.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "kernels" / "src" / "finish_normalize.cu"
FOLD_KERNEL = ROOT / "kernels" / "src" / "fold_eval_affine.cu"
COOPERATIVE_INCLUDE = "#include <cooperative_groups.h>"
DEVICE_CODE_END = "}  // namespace\n"  # the anonymous namespace holding a file's kernels; host code follows


def _cuda_home() -> Path | None:
    """The CUDA toolkit the extension builds with ($CUDA_HOME, else the nvcc of $CUDACXX or PATH, asked where
    its toolkit is: nvcc may be a wrapper script elsewhere), for its headers and cudart; None if not found."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if nvcc:
        dry_run = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                                 capture_output=True, text=True)  # fmt: skip
        top = re.search(r"^#\$ TOP=(.+)$", dry_run.stdout + dry_run.stderr, re.MULTILINE)
        candidates += [top.group(1).strip() if top else None, str(Path(nvcc).resolve().parent.parent)]
    for home in filter(None, candidates):
        if (Path(home) / "include" / "cuda_runtime.h").exists():
            return Path(home).resolve()
    return None


def test_finish_normalize_on_the_cpu(tmp_path):
    cuda, compiler = _cuda_home(), shutil.which("g++")
    if cuda is None or compiler is None:
        pytest.skip("needs g++ and the CUDA toolkit's headers (the extension's build needs both too)")
    source = KERNEL.read_text()
    assert source.count(COOPERATIVE_INCLUDE) == 1, "the kernel's includes changed: update this test"
    (tmp_path / "finish_normalize_source.cpp").write_text(
        source.replace(COOPERATIVE_INCLUDE, f'#include "{ROOT / "tests" / "emulation" / "emulation.h"}"')
    )
    # fold_eval_affine's kernel alone: its host function's <<<...>>> launch is CUDA syntax.
    fold = FOLD_KERNEL.read_text()
    assert DEVICE_CODE_END in fold, "fold_eval_affine.cu's layout changed: update this test"
    (tmp_path / "fold_eval_affine_source.cpp").write_text(fold[: fold.index(DEVICE_CODE_END)] + DEVICE_CODE_END +
                                                          "}  // namespace gemmbn\n")
    binary = tmp_path / "finish_normalize_emulated"
    library = next((d for d in (cuda / "lib64", cuda / "lib") if (d / "libcudart.so").exists()), cuda / "lib64")
    build = [compiler, "-std=c++20", "-O2", "-pthread", f"-I{tmp_path}", f"-I{ROOT / 'kernels' / 'include'}",
             f"-I{ROOT / 'kernels' / 'src'}", f"-I{cuda / 'include'}", str(ROOT / "tests" / "emulation" /
             "finish_normalize_emulated.cpp"), "-o", str(binary), f"-L{library}", "-lcudart",
             f"-Wl,-rpath,{library}"]  # fmt: skip
    built = subprocess.run(build, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-4000:]
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    print(ran.stdout)
    assert ran.returncode == 0, "cases out of bounds:\n" + "\n".join(
        line for line in ran.stdout.splitlines() if not line.startswith("ok")
    ) + ran.stderr[-2000:]
    assert ran.stdout.count("\nok ") + ran.stdout.startswith("ok ") == 3 + 18, "every case must have run"
