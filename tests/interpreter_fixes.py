"""Work around a Triton interpreter limitation so bf16 kernels can be tested on the CPU.

Under ``TRITON_INTERPRET=1`` bfloat16 tensors are stored as their uint16 bit patterns and
``InterpreterBuilder.create_dot`` multiplies those patterns (triton-lang/triton#11584;
maintainers: bf16 is "not supported yet" in the interpreter). We convert bf16 dot operands
to float32 exactly (a bf16 is the top half of a float32) before the matmul, which is what
the tensor cores do: exact products, float32 accumulation. Nothing in the kernels changes.
"""

from __future__ import annotations

import numpy as np


def _bf16_bits_to_f32(data: np.ndarray) -> np.ndarray:
    return (data.astype(np.uint32) << 16).view(np.float32)


def patch_bf16_dot() -> bool:
    """Install the fix; returns False when the interpreter is not importable."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_attnbench_bf16", False):
        return True
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a_data = _bf16_bits_to_f32(a.data) if a.dtype.scalar == tl.bfloat16 else a.data.astype(np.float32)
            b_data = _bf16_bits_to_f32(b.data) if b.dtype.scalar == tl.bfloat16 else b.data.astype(np.float32)
            return interpreter.TensorHandle(np.matmul(a_data, b_data, dtype=d.data.dtype) + d.data, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._attnbench_bf16 = True
    builder.create_dot = create_dot
    return True
