"""fp32 register fragments to fp16 / bf16, two values per instruction.

``TensorSSA.to()`` converts one value at a time for fragments whose size is not a multiple of
the vector width it likes (P tiles 80, 96 or 112 keys wide): scalar cvt plus byte moves, which
also made ptxas put a warpgroup.arrive before every P V WGMMA (warning C7519) and serialise it
with the softmax. ``cvt.rn.{bf16x2,f16x2}.f32`` packs a pair in one instruction at any size.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cutlass_dsl import dsl_user_op

from cuteattn.kernels.common.inline_ptx import inline_ptx

_PTX_TYPE = {cutlass.BFloat16: "bf16x2", cutlass.Float16: "f16x2"}


@dsl_user_op
def _pack_pair(low: Float32, high: Float32, ptx_type: str, *, loc=None, ip=None) -> Int32:
    # cvt.rn.<t>x2.f32 d, a, b puts a in the upper half and b in the lower half of d.
    return inline_ptx(Int32, [Float32(high), Float32(low)], f"cvt.rn.{ptx_type}.f32 $0, $1, $2;",
                      "=r,f,f", side_effects=False, loc=loc, ip=ip)


def convert_packed(src: cute.Tensor, dst: cute.Tensor):
    """dst[i] = src[i] rounded to dst's 16-bit type, i over both tensors' flat index.

    Both must be register fragments of one size, compact (flat index = register order), with
    an even size. Plain Python, traced inside the caller's jit.
    """
    ptx_type = _PTX_TYPE[dst.element_type]
    size = cute.size(src)
    if size != cute.size(dst) or size % 2:
        raise ValueError(f"convert_packed needs equal, even sizes, got {size} and {cute.size(dst)}")
    flat_src = cute.make_tensor(src.iterator, cute.make_layout(size))
    flat_dst = cute.recast_tensor(cute.make_tensor(dst.iterator, cute.make_layout(size)), Int32)
    for i in range(size // 2):
        flat_dst[i] = _pack_pair(flat_src[2 * i], flat_src[2 * i + 1], ptx_type)
