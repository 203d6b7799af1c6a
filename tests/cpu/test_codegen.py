"""Code-generation guards for the sm90 forward, read from the PTX a CPU compile emits.

Two regressions found by comparing our SASS with FlashAttention-4's would come back silently
(results stay right, the kernel gets slower): the causal mask written as a runtime ``if``
(each masked tile carried every score written so far: ~2000 selects per kernel instead of
~160), and P converted one value at a time at key tiles of 80-112 (scalar cvt, and ptxas
serialised P V behind the softmax).
"""

import glob

import pytest

from cuteattn.arch import arch_from_name
from cuteattn.plan import get_family

pytestmark = pytest.mark.compile


def compiled_ptx(tmp_path, **plan_fields) -> str:
    import cutlass
    import cutlass.cute as cute

    family = get_family("sm90")
    plan = family.plan(arch_from_name("sm_90a"), dtype="bf16", num_stages=2, **plan_fields)
    assert family.can_implement(plan, arch_from_name("sm_90a"))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    cute.compile(
        family.kernel(plan),
        *family.fake_forward_args(plan),
        cutlass.Float32(1.0),
        cutlass.Int32(1),
        family.fake_tile_counter(plan),
        stream,
        options=f"--enable-tvm-ffi --gpu-arch sm_90a --keep-ptx --dump-dir {tmp_path}",
    )
    (path,) = glob.glob(f"{tmp_path}/*.ptx")
    with open(path) as ptx:
        return ptx.read()


def test_causal_mask_is_selects_not_branches(tmp_path):
    ptx = compiled_ptx(
        tmp_path, head_dim=128, causal=True, tile_m=128, tile_n=128, persistent=True
    )
    assert ptx.count("selp") < 400  # 161 at df81c13, 2145 before it


def test_p_is_converted_two_values_per_instruction(tmp_path):
    tile_n = 112
    ptx = compiled_ptx(
        tmp_path, head_dim=192, causal=False, tile_m=128, tile_n=tile_n, persistent=False
    )
    # Each thread holds 64 * tile_n / 128 values of P per key tile: one packed cvt per pair.
    assert ptx.count("cvt.rn.bf16x2.f32") >= 64 * tile_n // 128 // 2
