"""Where Triton puts a partition barrier between mbarrier waits (no GPU needed).

Compiles four small Gluon loops for sm_90 and counts the ``bar.sync`` in their loop's
PTX: one wait per iteration; two waits on two barrier allocations; one wait and a global
store; two waits on one allocation. The first three get one ``bar.sync`` per iteration, the
last two: Triton's shared-memory barrier analysis treats an ``mbarrier.wait`` as a write of
its barrier, so two waits on the same allocation (the same ring of barriers, also one
iteration apart) need a barrier between them, while waits on different allocations do not.
That is the ``bar.sync`` before each tile's first wait in `qblock_ws`'s consumer loop
(docs/perf/kernels-h100.md).

    python3 docs/perf/wait_barriers.py
"""

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

CASES = {0: "one wait an iteration", 1: "two waits, two allocations", 2: "one wait and a global store",
         3: "two waits, one allocation"}


@gluon.jit
def waits_in_a_loop(out, n, CASE: gl.constexpr):
    a = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    b = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(a.index(i), count=1)
        mbarrier.init(b.index(i), count=1)
    for j in range(n):
        mbarrier.wait(a.index(j % 2), (j // 2) & 1)
        if CASE == 1:
            mbarrier.wait(b.index(j % 2), (j // 2) & 1)
        if CASE == 2:
            gl.store(out + j, 1.0)
        if CASE == 3:
            mbarrier.wait(a.index((j + 1) % 2), (j // 2) & 1)


def main() -> None:
    for case, what in CASES.items():
        src = GluonASTSource(fn=waits_in_a_loop, signature={"out": "*fp32", "n": "i32", "CASE": "constexpr"},
                             constexprs={"CASE": case})
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
        lines = ptx.splitlines()
        loop = next(i for i, line in enumerate(lines) if "Loop Header" in line or "Inner Loop" in line)
        in_loop = sum("bar.sync" in line for line in lines[loop:])
        print(f"{what:40s} bar.sync in the loop: {in_loop}")


if __name__ == "__main__":
    main()
