"""The Python host path of gemmbn's forward and backward, timed on the CPU with gemmbn's operators replaced by no-ops.

    python perf/host_path.py [--size M K N] [--dtype float32|bfloat16] [--precision high|highest] [--calls 20000]
                             [--profile]

No GPU is needed: the tensors are CPU tensors, the device checks are patched to accept them and every
operator call returns at once, so what is timed is the Python the forward runs before (and after) its one
operator call: the module's lookups, validation. At small shapes that host time is the
forward's latency on the GPU (the device waits for the launch), so a change here can be measured without a
device; on the H200's host the same path takes ~3x as long (perf/host_overhead.py measures it there against
eager and torch.compile).

Not measured: the operator call itself (the dispatcher, its argument checks, allocations through the caching
allocator, the current-stream query and the launches). Each timed forward must reach the stubbed
train_forward/eval_forward_folded exactly once, or the script stops: a fallback to the reference would time the wrong
path. The backward rows (a training step's forward and backward through autograd, and the backward alone) stub
the kernel call and the two gradient GEMMs (backward._matmul returns an empty result: the GEMMs' own dispatch
costs as much as eager's), and each must reach the stubbed batch_norm_backward once. A training step with its SGD
update (momentum 0.9, as perf/train_step.py's `step`) is timed beside the one without; on CPU tensors SGD runs its ops
tensor by tensor (use a small --size), so compare the update's cost between routes, not with a device's step.
`--precision highest` (float32) takes the fp32-faithful route: the weight split (weight_cache: made again after every
update of W), split_columns and split_matmul stubbed as well.
"""

from __future__ import annotations

import argparse
import copy
import time
import types
from collections.abc import Callable

import torch
from gemmbn import GemmScaleBatchNorm, backward, eval_fold_cache, functional, fused, ops, precision, weight_cache
from host_overhead import print_profile
from train_step import _step


class StubOperators(types.SimpleNamespace):
    """gemmbn's native operators (_native.operator(name)) as no-ops that count their calls and return outputs of
    the right shapes, allocated once (in the real operators C++ allocates them: not timed here)."""

    def __init__(self, M: int, N: int, dtype: torch.dtype) -> None:
        super().__init__(calls={"train_forward": 0, "eval_forward_folded": 0, "batch_norm_backward": 0,
                                "split_weight": 0})
        self.mn, self.n = torch.empty(M, N, dtype=dtype), torch.empty(N, dtype=dtype)
        self.weight_split = torch.empty(N, 1, dtype=torch.float16), torch.empty(N)
        self.stats, self.affine = torch.empty(N), torch.empty(2, N)
        # batch_norm_backward's dz^T and dz's row and column maxima (float32 "highest" asks for them)
        self.transposed = torch.empty(N, -(-M // 4) * 4), torch.empty(M, dtype=torch.int32), torch.empty(N, dtype=torch.int32)

    def train_forward(self, *args) -> tuple[torch.Tensor, ...]:
        self.calls["train_forward"] += 1
        return self.mn, self.mn, self.stats, self.stats

    def eval_affine(self, *args) -> torch.Tensor:  # the eval fold, cached by eval_fold_cache: not counted
        return self.affine

    def eval_forward_folded(self, *args) -> torch.Tensor:
        self.calls["eval_forward_folded"] += 1
        return self.mn

    def batch_norm_backward(self, *args) -> tuple[torch.Tensor, ...]:
        self.calls["batch_norm_backward"] += 1
        return self.mn, self.n, self.n, self.n, self.n, *self.transposed

    def split_weight(self, weight) -> tuple[torch.Tensor, torch.Tensor]:  # counted: one per version of W
        self.calls["split_weight"] += 1
        return self.weight_split

    def split_columns(self, t) -> tuple[torch.Tensor, None]:  # t itself stands for its split: split_matmul's N
        return t, None

    def split_matmul(self, a, b_split, b_unscale, a_row_max) -> torch.Tensor:  # the GEMM: its output, eager's cost
        return a.new_empty((a.shape[0], b_split.shape[1]))


def install_stub(M: int, N: int, dtype: torch.dtype) -> StubOperators:
    """Route the fused path to a StubOperators with CPU tensors (this process only)."""
    stub = StubOperators(M, N, dtype)
    fused.operator = eval_fold_cache.operator = weight_cache.operator = lambda name: getattr(stub, name)
    # The fold cache asks whether the current CUDA stream is capturing a graph; a CPU build of torch cannot answer.
    torch.cuda.is_current_stream_capturing = lambda: False
    ops.fused_unavailable_reason = backward.fused_unavailable_reason = lambda x: None
    backward._matmul = lambda route, a, b: a.new_empty((a.shape[0], b.shape[1]))  # the GEMM itself: eager's cost
    return stub


def per_call_us(fn: Callable[[], object], calls: int) -> tuple[float, int]:
    """(median over 5 rounds of the wall time per call, in us; calls made, warm-up included)."""
    warmup, per_round = max(calls // 100, 10), max(calls // 5, 1)
    for _ in range(warmup):
        fn()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(per_round):
            fn()
        rounds.append((time.perf_counter() - start) / per_round * 1e6)
    return sorted(rounds)[2], warmup + 5 * per_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, default=(128, 1024, 512), metavar=("M", "K", "N"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--precision", default="high", choices=["high", "highest"],
                        help="float32's GEMM: TF32 (high) or the fp32-faithful split GEMM (highest)")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--profile", action="store_true", help="add cProfile's tables of the training and eval forwards")
    args = parser.parse_args()
    M, K, N = args.size
    dtype = getattr(torch, args.dtype)
    if args.precision == "highest" and dtype != torch.float32:
        parser.error("--precision highest is float32's (16-bit data ignores the float32 precision)")
    torch.set_float32_matmul_precision(args.precision)
    gemm_kind = precision.resolve(dtype, args.precision)
    stub = install_stub(M, N, dtype)
    torch.manual_seed(0)
    module = GemmScaleBatchNorm(K, N, (N,), dtype=dtype)
    evaluating = copy.deepcopy(module).eval()  # its own module: switching modes costs ~5 us a call
    x = torch.randn(M, K, dtype=dtype)
    gemm, bn = module.gemm, module.bn
    weight, bias, scale = gemm.weight.detach(), gemm.bias.detach(), module.scale.detach()
    gamma, beta, rm, rv, nbt = bn.weight.detach(), bn.bias.detach(), bn.running_mean, bn.running_var, bn.num_batches_tracked
    rows = {
        "module forward, train": ("train_forward", lambda: module(x)),
        "module forward, eval": ("eval_forward_folded", lambda: evaluating(x)),
        "functional, train": ("train_forward", lambda: functional.linear_scale_batch_norm(
            x, weight, bias, scale, gamma, beta, rm, rv, nbt, True, 0.1, 1e-5)),
        "ops._train_impl": ("train_forward", lambda: ops._train_impl(
            x, weight, bias, scale, gamma, beta, rm, rv, nbt, 0.1, 1e-5, "default", False)),
        "fused.train_forward": ("train_forward", lambda: fused.train_forward(
            x, weight, bias, scale, gamma, beta, rm, rv, nbt, 0.1, 1e-5, gemm_kind, False)),
        "  functional._validate": (None, lambda: functional._validate(
            x, weight, bias, scale, gamma, beta, rm, rv, nbt, True, 1e-5)),
    }
    x_grad = x.clone().requires_grad_(True)
    dout = torch.randn(M, N, dtype=dtype)
    y, mean, invstd = torch.randn(M, N, dtype=dtype), torch.zeros(N), torch.ones(N)

    training_step = _step(module, x_grad, dout, None)
    stepping = copy.deepcopy(module)  # its own parameters: the update moves them (and W's version) every step
    optimizer = torch.optim.SGD(stepping.parameters(), lr=1e-4, momentum=0.9, foreach=True)  # as on CUDA
    training_step_with_update = _step(stepping, x_grad, dout, optimizer)

    split_per_update = 1 if gemm_kind == precision.SPLIT_FP32 else 0  # the split W, made again after each update
    grad_rows = {
        # As a training loop calls it: parameters that require grad, so the forward records its autograd node.
        "module forward, train, grad": ({"train_forward": 1}, lambda: module(x)),
        "module forward, eval, grad": ({"eval_forward_folded": 1}, lambda: evaluating(x)),
        "forward + backward, train": ({"train_forward": 1, "batch_norm_backward": 1}, training_step),
        "  + SGD update": ({"train_forward": 1, "batch_norm_backward": 1, "split_weight": split_per_update},
                           training_step_with_update),
        "backward alone, train": ({"batch_norm_backward": 1}, lambda: backward.linear_scale_bn_backward(
            dout, x, weight, bias, scale, gamma, beta, y, mean, invstd, True, [True] * 6, args.precision)),
    }
    print(f"{M}x{K}->{N} {args.dtype} ({gemm_kind}), gemmbn's operators stubbed, CPU tensors, torch "
          f"{torch.__version__}, median of 5 rounds of {args.calls // 5} calls")
    with torch.no_grad():
        for label, (entry, fn) in rows.items():
            _time_row(label, fn, stub, {entry: 1} if entry else None, args.calls)
        if args.profile:
            print_profile(lambda: module(x), args.calls, rows=20)
            print_profile(lambda: evaluating(x), args.calls, rows=20)
    for label, (entries, fn) in grad_rows.items():
        calls = args.calls if "backward" not in label else max(args.calls // 10, 100)  # a backward: ~10 forwards
        _time_row(label, fn, stub, entries, calls)
    if args.profile:
        print_profile(training_step, calls, rows=20)


def _time_row(label: str, fn: Callable[[], object], stub: StubOperators, entries: dict | None, calls: int) -> None:
    """Print fn's host time per call; with ``entries`` (stub name -> calls per call), stop unless every call
    reached exactly those stubbed entry points (a fallback to the reference would time the wrong path). One call
    first, uncounted: what a row keeps cached (the eval fold, the split weight) is made before the count starts."""
    fn()
    before = dict(stub.calls)
    us, made = per_call_us(fn, calls)
    if entries is not None:
        reached = {name: stub.calls[name] - before[name] for name in stub.calls}
        if reached != {name: made * entries.get(name, 0) for name in stub.calls}:
            raise SystemExit(f"{label}: {made} calls reached the stub as {reached} (the fallback ran?)")
    print(f"  {label:26s} {us:7.2f} us/call")


if __name__ == "__main__":
    main()
