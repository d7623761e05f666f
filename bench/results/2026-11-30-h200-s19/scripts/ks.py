"""key_steps variants, monkeypatched in by name (env KS)."""

import os

import cutlass.cute as cute
from cutlass import Int64
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu.tcgen05.helpers import int_to_smem_descriptor, smem_descriptor_to_int

import flashcute.kernels.sm90.fwd as F
from flashcute.kernels.common.wgmma import k_steps


def opaque64(x):
    return Int64(
        llvm.inline_asm(
            Int64.mlir_type, [x.ir_value()], "mov.b64 $0, $1;", "=l,l", has_side_effects=False, is_align_stack=False
        )
    )


def ks_opaque_stage(self, tSrK, stage):
    base = smem_descriptor_to_int(tSrK.iterator) + Int64(cute.crd2idx((0, 0, 0, stage), tSrK.layout))
    base = opaque64(base)
    return [
        cute.make_tensor(
            int_to_smem_descriptor(base + Int64(cute.crd2idx((0, 0, k, 0), tSrK.layout))), tSrK[None, None, k, 0].layout
        )
        for k in range(cute.size(tSrK.shape[2]))
    ]


def ks_opaque_stage_uni(self, tSrK, stage):
    return ks_opaque_stage(self, tSrK, cute.arch.make_warp_uniform(stage))


def ks_k64(self, tSrK, stage):
    return k_steps(tSrK[None, None, None, stage])


V = {"opaque": ks_opaque_stage, "opaqueuni": ks_opaque_stage_uni, "k64": ks_k64}
if os.environ.get("KS"):
    F.FlashAttentionForwardSm90.key_steps = V[os.environ["KS"]]


def ks_uni64(self, tSrK, stage):
    return k_steps(tSrK[None, None, None, cute.arch.make_warp_uniform(stage)])


V["uni64"] = ks_uni64
if os.environ.get("KS"):
    F.FlashAttentionForwardSm90.key_steps = V[os.environ["KS"]]
