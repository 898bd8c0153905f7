"""Non-temporal (streaming) stores for the dequant drivers, x86-64 only.

A dequantized tensor is 4 to 16 times the size of its blocks, so a large
dequant is bound by writing its output: an ordinary store first reads the
cache line it writes (read for ownership), which halves the bandwidth left
for the writes. A non-temporal store writes the line without reading it.
Measured on this project's 2-vCPU Xeon (AVX-512), one thread filling 260 MB
of float32: 9.1 GB/s with ordinary stores, 25.9 GB/s with 16-byte
non-temporal stores. ggml's `to_float` uses ordinary stores, so for the
output-bound types (Q8_0, Q4_K, TQ2_0 ...) this is the difference between
matching it and passing it.

`stream4(dst, src, j)` copies the 4 float32 `src[j:j+4]` to `dst[j:j+4]`
with one 16-byte non-temporal store: `dst[j]` must be 16-byte aligned and
`dst` contiguous (the caller checks). The bits are copied as they are.
`sfence()` orders the streamed stores before any later store of the
thread, so another thread that sees the driver's completion sees the data.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

#: True where the drivers may stream (the intrinsics emit x86 instructions).
AVAILABLE = platform.machine().lower() in ("x86_64", "amd64")

_V4 = ir.VectorType(ir.FloatType(), 4)


@intrinsic
def stream4(typingctx, dst, src, j):
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
            and dst.dtype == types.float32 and src.dtype == types.float32
            and dst.ndim == 1 and src.ndim == 1 and isinstance(j, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        d = context.make_array(sig.args[0])(context, builder, args[0])
        s = context.make_array(sig.args[1])(context, builder, args[1])
        k = context.cast(builder, args[2], sig.args[2], types.intp)
        v = builder.load(builder.bitcast(builder.gep(s.data, [k]), _V4.as_pointer()), align=4)
        st = builder.store(v, builder.bitcast(builder.gep(d.data, [k]), _V4.as_pointer()), align=16)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()
    return types.void(dst, src, j), codegen


@intrinsic
def sfence(typingctx):
    def codegen(context, builder, sig, args):
        fn = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence") \
            if "llvm.x86.sse.sfence" not in builder.module.globals \
            else builder.module.globals["llvm.x86.sse.sfence"]
        builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen
