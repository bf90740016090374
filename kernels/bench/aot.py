"""Compile kernels ahead of time for a GPU target without a GPU.

`captured_launches` records what a launcher would launch (kernel, grid, arguments,
constexprs, warps, stages) instead of running it; `compile_launch` feeds such a record to
Triton's compiler for a named target: ``sm_90`` (H100/H200), ``sm_100`` (B200), ``gfx942``
(MI300X) or ``gfx90a`` (MI250). Tests use this to prove on a CPU-only machine that every
kernel compiles for both vendors and maps its ``tl.dot`` onto the matrix units, and to
read each launch's grid. Gluon kernels (`kernels/hopper`, sm_90 only) go through the same
path: Gluon has no interpreter, so this build is what a CPU-only machine can check of them.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from ..config import Platform
from ..dispatch.api import paged_attention
from ..dispatch.heuristics import choose_config
from ..variants import STEPS
from .batch import PagedBatch

TARGETS = {
    "sm_90": GPUTarget("cuda", 90, 32),
    "sm_100": GPUTarget("cuda", 100, 32),
    "gfx942": GPUTarget("hip", "gfx942", 64),
    "gfx90a": GPUTarget("hip", "gfx90a", 64),
}

_TORCH_TO_TRITON = {
    torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
    torch.int32: "i32", torch.int64: "i64",
}
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg")


@dataclass
class Launch:
    """One kernel launch as a launcher issued it."""

    kernel: object  # JITFunction, or InterpretedFunction under TRITON_INTERPRET=1
    grid: tuple
    args: dict
    constexprs: dict
    options: dict = field(default_factory=dict)
    compile_only: bool = False  # `kernel.warmup(...)`: compiled, not launched

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def binary_key(self) -> tuple:
        """What selects the compiled binary in Triton's cache: the kernel, its argument
        types, constexprs, launch options and the divisibility hints of `_specialization`."""
        types = tuple((name, _arg_type(name, value)) for name, value in self.args.items())
        hints = tuple(sorted(_specialization(self)))
        return (self.name, types, tuple(sorted(self.constexprs.items())),
                tuple(sorted(self.options.items())), hints)


@contextlib.contextmanager
def captured_launches():
    """Within the block, Triton kernels are recorded into the yielded list, not run."""
    records: list[Launch] = []
    classes = [JITFunction]
    try:  # optional: the interpreter's kernels, where this Triton has it
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:
        pass
    originals = {cls: cls.run for cls in classes}

    def record(self, *args, grid, warmup, **kwargs):
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in _LAUNCH_OPTIONS}
        params = inspect.signature(self.fn).parameters
        values = dict(zip(params, args)) | kwargs
        is_constexpr = {name: _is_constexpr(p.annotation) for name, p in params.items()}
        constexprs = {k: v for k, v in values.items() if is_constexpr[k]}
        runtime = {k: v for k, v in values.items() if not is_constexpr[k]}
        grid = grid(values) if callable(grid) else tuple(grid)
        records.append(Launch(self, grid, runtime, constexprs, options, compile_only=bool(warmup)))

    for cls in classes:
        cls.run = record
    try:
        yield records
    finally:
        for cls, run in originals.items():
            cls.run = run


def _is_constexpr(annotation) -> bool:
    # kernel modules use `from __future__ import annotations`: annotations may be strings
    # (``gl.constexpr`` in the Gluon kernels of `kernels/hopper`)
    return annotation is tl.constexpr or annotation in ("tl.constexpr", "gl.constexpr", "constexpr")


def _arg_type(name: str, value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _TORCH_TO_TRITON[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"{name}: cannot type a kernel argument of {type(value).__name__}")


def _not_specialized(kernel) -> set[str]:
    """Names of the kernel's ``do_not_specialize`` arguments (JIT or interpreted kernel)."""
    names = getattr(kernel, "do_not_specialize", None)
    if names is None:  # InterpretedFunction keeps the decorator's keywords
        names = getattr(kernel, "kwargs", {}).get("do_not_specialize")
    params = list(inspect.signature(kernel.fn).parameters)
    return {params[n] if isinstance(n, int) else n for n in names or ()}


def _specialization(launch: Launch) -> dict:
    """The divisibility hints Triton's JIT would attach: 16-byte-aligned pointers and
    integers divisible by 16 (except ``do_not_specialize`` arguments). Without them the
    compiler cannot prove alignment and emits no async copies (cp.async), so an AOT build
    would not show the real pipelining."""
    names = list(inspect.signature(launch.kernel.fn).parameters)
    skip = _not_specialized(launch.kernel)
    attrs = {}
    for name, value in launch.args.items():
        if name in skip:
            continue
        aligned = (value.data_ptr() % 16 == 0 if isinstance(value, torch.Tensor)
                   else isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0)
        if aligned:
            attrs[(names.index(name),)] = [["tt.divisibility", 16]]
    return attrs


def compile_launch(launch: Launch, target: str):
    """Compile a recorded launch for ``target`` (a key of `TARGETS`); returns the kernel."""
    if target not in TARGETS:
        raise ValueError(f"target: expected one of {sorted(TARGETS)}, got {target!r}")
    if not isinstance(launch.kernel, JITFunction):
        raise RuntimeError("compile_launch needs real JIT kernels: unset TRITON_INTERPRET")
    signature = {name: _arg_type(name, value) for name, value in launch.args.items()}
    signature.update({name: "constexpr" for name in launch.constexprs})
    source = ASTSource
    if launch.kernel.is_gluon():  # a Gluon kernel is lowered from its own AST source (lazy: Gluon only)
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(fn=launch.kernel, signature=signature, constexprs=launch.constexprs,
                 attrs=_specialization(launch))
    return triton.compile(src, target=TARGETS[target], options=dict(launch.options))


def matrix_instructions(compiled) -> set[str]:
    """Matrix-unit instruction families in a compiled kernel's assembly."""
    asm = compiled.asm.get("ptx") or compiled.asm.get("amdgcn") or ""
    found = set()
    for token in ("wgmma", "mma.sync", "v_mfma", "v_wmma"):
        if token in asm:
            found.add(token)
    return found


def wgmma_waits(compiled) -> list[int]:
    """The ``N`` of every ``wgmma.wait_group N`` in a compiled kernel's PTX: a wait with
    N > 0 leaves matrix products in flight (an overlap the kernel asked for)."""
    return sorted({int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)",
                                              compiled.asm.get("ptx") or "")})


def atomic_orders(compiled) -> list[str]:
    """The memory order of every global atomic in a compiled CUDA kernel's PTX (``relaxed``,
    ``acq_rel``, ...), in program order; none for a kernel built for another vendor."""
    return re.findall(r"atom\.global(?:\.\w+)*?\.(relaxed|acquire|release|acq_rel)\.", compiled.asm.get("ptx") or "")


def fp32_divisions(compiled) -> int:
    """fp32 divisions in a compiled CUDA kernel's PTX: each is four or five SASS
    instructions (ptxas's range scaling around ``MUFU.RCP``), so a kernel that normalizes
    its output divides once per row, not per element."""
    return len(re.findall(r"\bdiv\.(?:full|rn|approx)[\w.]*\.f32\b", compiled.asm.get("ptx") or ""))


def masked_selects(compiled) -> int:
    """``selp.f32 ..., -inf`` in a compiled CUDA kernel's PTX: the scores a causal mask
    puts -inf in with one select each (`hopper.blocks.hide_later_keys`)."""
    return len(re.findall(r"selp\.f32\s+\S+,\s*\S+,\s*0fFF800000", compiled.asm.get("ptx") or ""))


def ptxas_report(compiled, arch: int = 90) -> str:
    """What Triton's own ptxas says (``-v``) about a compiled CUDA kernel's PTX for
    ``sm_<arch>a``: registers, spills, and warnings such as C7512 (wgmma serialized: the
    tensor-core overlap a kernel asked for is lost)."""
    from triton.backends.nvidia.compiler import get_ptxas  # lazy: NVIDIA's backend only

    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        proc = subprocess.run([get_ptxas(arch).path, f"-arch=sm_{arch}a", "-v", str(ptx), "-o", str(ptx) + ".o"],
                              capture_output=True, text=True, check=True)
    return proc.stdout + proc.stderr


def _llama3_mixed_batch():
    return PagedBatch.build([(1, 40), (6, 30), (20, 0)], num_q_heads=32, num_kv_heads=8, head_size=128,
                            block_size=16, dtype=torch.bfloat16, device="cpu", seed=0)


def hopper_launches() -> dict[str, list[Launch]]:
    """Launches of the sm_90-only kernels (`kernels/hopper`) on the mixed batch of
    `representative_launches` (``qblock_ws`` also persistent, claiming its items: its own
    binary), and on its Gemma-2 and Phi-3 twins (16/8 heads of 256 with a softcap; 32/32
    heads of 96, computed in two column pieces as 192 is: 16/8 heads); ``qblock_ws`` also
    split, each Q-block's tiles in 4 segments, and the split's reduction."""
    from ..hopper import qblock_wgmma, qblock_ws  # lazy: Gluon's Hopper API, not in every Triton

    llama = _llama3_mixed_batch()
    gemma = PagedBatch.build([(1, 40), (6, 30), (20, 0)], num_q_heads=16, num_kv_heads=8, head_size=256,
                             block_size=16, dtype=torch.bfloat16, device="cpu", seed=0, softcap=50.0)
    phi3 = PagedBatch.build([(1, 40), (6, 30), (20, 0)], num_q_heads=32, num_kv_heads=32, head_size=96,
                            block_size=16, dtype=torch.bfloat16, device="cpu", seed=0)
    h192 = PagedBatch.build([(1, 40), (6, 30), (20, 0)], num_q_heads=16, num_kv_heads=8, head_size=192,
                            block_size=16, dtype=torch.bfloat16, device="cpu", seed=0)
    out = {}
    for name, launch, batch in (
            ("qblock_wgmma", qblock_wgmma.launch, llama), ("qblock_ws", qblock_ws.launch, llama),
            ("qblock_ws_pp", partial(qblock_ws.launch, pingpong=True), llama),
            ("qblock_ws_dynamic", partial(qblock_ws.launch, persistent=True, dynamic=True), llama),
            ("qblock_ws_t64_lazy", partial(qblock_ws.launch, tile_size=64, lazy_rescale=True), llama),
            ("qblock_wgmma_h256", partial(qblock_wgmma.launch, tile_size=64), gemma),
            ("qblock_ws_h256", partial(qblock_ws.launch, tile_size=64), gemma),
            ("qblock_ws_h96", qblock_ws.launch, phi3),
            ("qblock_ws_h192", partial(qblock_ws.launch, tile_size=64), h192),
            ("qblock_ws_split", partial(qblock_ws.launch, num_segments=4, max_seqlen_q=40, max_seqlen_k=40), llama),
            ("qblock_ws_h256_split", partial(qblock_ws.launch, tile_size=64, num_segments=4), gemma)):
        with captured_launches() as launches:
            launch(torch.empty_like(batch.q), batch.q, batch.k_cache, batch.v_cache, batch.block_table,
                   batch.cu_seqlens_q, batch.seq_lens, scale=batch.head_size ** -0.5, sliding_window=None,
                   softcap=batch.softcap)
        out[name] = launches
    return out


def representative_launches() -> dict[str, list[Launch]]:
    """Launches of every step on Llama-3-8B heads (32/8/128, bf16, page 16): of a mixed
    batch, or of a decode batch where that launches more kernels (the static grid's segment
    reduction runs only on decode batches)."""
    mixed = _llama3_mixed_batch()
    decode = PagedBatch.build([(1, 300)] * 2, num_q_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                              dtype=torch.bfloat16, device="cpu", seed=0)
    h100 = Platform("cuda", 132, "aot")  # configs as the heuristics pick them for a GPU

    def recorded(variant: str, batch: PagedBatch) -> list[Launch]:
        with captured_launches() as launches:
            paged_attention(**batch.attention_kwargs(), config=choose_config(batch.shape, h100, variant))
        return launches

    return {variant: max(recorded(variant, mixed), recorded(variant, decode), key=len) for variant in STEPS}


def main(argv: list[str] | None = None) -> int:
    """Print one JSON line per (variant, kernel, target) build of the representative launches
    (and, for sm_90, of the Hopper-only kernels)."""
    targets = (argv if argv is not None else sys.argv[1:]) or ["sm_90", "gfx942"]
    builds = [(variant, launch, target) for variant, launches in representative_launches().items()
              for launch in launches for target in targets]
    hopper = hopper_launches() if "sm_90" in targets else {}
    builds += [(name, launch, "sm_90") for name, launches in hopper.items() for launch in launches]
    for variant, launch, target in builds:
        compiled = compile_launch(launch, target)
        build = {
            "variant": variant, "kernel": launch.name, "target": target,
            "grid": list(launch.grid), "shared_bytes": compiled.metadata.shared,
            "matrix_instructions": sorted(matrix_instructions(compiled)),
            "wgmma_waits": wgmma_waits(compiled),
            "atomic_orders": atomic_orders(compiled),
            "fp32_divisions": fp32_divisions(compiled), "masked_selects": masked_selects(compiled),
        }
        if variant in hopper:  # what ptxas says of the kernels written for this chip
            build["ptxas"] = ptxas_report(compiled)
        print(json.dumps(build), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
