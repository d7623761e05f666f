"""Steps 3 and 6 on Hopper: warpgroup MMAs (wgmma.mma_async), 64 rows of the output per warpgroup.

S = Q K^T reads both operands from shared memory through descriptors; O += P V takes P from the registers that
held S (converted to 16 bits) and V^T from a transposed view of the V tile, so V is never copied. wgmma runs
asynchronously: ``gemm`` issues the k-steps and commits them as one group, and the caller waits for the group
with ``warpgroup.wait_group`` before it reads the accumulator, so softmax can run while the tensor cores work.

A shared-memory operand is a fragment of 64-bit descriptors (start address, strides, swizzle). The DSL builds a
descriptor where an MMA uses it, from the shared-memory pointer, so inside a loop it is rebuilt every iteration;
``fixed_descriptors`` computes it once, where it is called, and ``gemm_steps`` issues MMAs from per-k-step operands
such as those, so a loop-invariant operand (Q) costs no descriptor arithmetic in the loop.
"""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.cute.nvgpu.tcgen05.helpers import int_to_smem_descriptor, smem_descriptor_to_int

from flashcute.kernels.common.layout import acc_rows_cols, store_converted


def make_tiled_mmas(dtype: type[cutlass.Numeric], block_n: int, head_dim: int) -> tuple[cute.TiledMma, cute.TiledMma]:
    """(Q K^T, P V) MMAs of one warpgroup: (64, block_n) scores from smem x smem, (64, head_dim) output from
    registers x smem (V is N-major: its rows are keys, its contiguous dim the head dim)."""
    qk = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (64, block_n)
    )
    pv = sm90_utils.make_trivial_tiled_mma(
        dtype,
        dtype,
        OperandMajorMode.K,
        OperandMajorMode.MN,
        Float32,
        (1, 1, 1),
        (64, head_dim),
        warpgroup.OperandSource.RMEM,
    )
    return qk, pv


def transpose_view(sX: cute.Tensor) -> cute.Tensor:
    """(rows, cols, stages) -> (cols, rows, stages) over the same (swizzled) bytes: V^T for the P V MMA."""
    return cute.make_tensor(sX.iterator, cute.select(sX.layout, mode=[1, 0, 2]))


def k_steps(frag: cute.Tensor) -> list[cute.Tensor]:
    """The k-steps of an MMA operand fragment (MMA, MMA_M or MMA_N, MMA_K): one wgmma's operand each."""
    return [frag[None, None, k] for k in range(cute.size(frag.shape[2]))]


def _opaque(desc: Int64) -> Int64:
    """``desc`` through an inline-PTX ``mov.b64``: the compiler cannot see what it is computed from."""
    return Int64(
        llvm.inline_asm(
            Int64.mlir_type, [desc.ir_value()], "mov.b64 $0, $1;", "=l,l", has_side_effects=False, is_align_stack=False
        )
    )


def fixed_descriptors(frag: cute.Tensor) -> cute.Tensor:
    """The shared-memory descriptor fragment ``frag`` over a descriptor computed here, once.

    Same layout, same descriptors: slicing the result adds the same offsets to the same base. The base goes through
    an opaque move, so the compiler cannot fold it back into the pointer arithmetic it would otherwise redo at every
    use; call this outside the loops that use the fragment.
    """
    return cute.make_tensor(int_to_smem_descriptor(_opaque(smem_descriptor_to_int(frag.iterator))), frag.layout)


K_DESCRIPTOR_FORMS = ("64bit", "32bit", "uniform")


def stage_steps(fixed: cute.Tensor, stage: cutlass.Int32, form: str) -> list[cute.Tensor]:
    """k_steps(fixed[None, None, None, stage]) for a ``fixed_descriptors`` fragment (MMA, MMA_N, MMA_K, stage).

    Which instructions ptxas makes of the stage and k-step offsets depends on how they are written, differently
    for each head dim and dtype (SASS of the free step, Sm90FwdConfig.k_descriptors chooses by measurement):

    - "64bit": slices of ``fixed``, 64-bit adds to the descriptor (bf16 D=256: 425 instructions, UIADD3.64 in
      uniform registers; fp16 D=256: 492, the adds in ordinary registers, 42 R2UR moving the results).
    - "32bit": the offsets added to the descriptors' low 32 bits only (their start address is the low 14 bits,
      shared memory >> 4, and an offset inside shared memory never carries out of it): fp16 D=256 462, D=128 460.
    - "uniform": the stage's base computed once from the stage index made warp-uniform, behind an opaque move,
      then a 64-bit add a k-step: fp16 D=256 435 (14 R2UR), bf16 D=256 426.
    Any other ``form`` is "32bit" (Sm90FwdConfig's can_implement admits K_DESCRIPTOR_FORMS only).
    """
    if cutlass.const_expr(form == "64bit"):
        return k_steps(fixed[None, None, None, stage])
    k_offsets = [cute.crd2idx((0, 0, k, 0), fixed.layout) for k in range(cute.size(fixed.shape[2]))]
    k_layouts = [fixed[None, None, k, 0].layout for k in range(cute.size(fixed.shape[2]))]
    if cutlass.const_expr(form == "uniform"):
        stage = cute.arch.make_warp_uniform(stage)
        base = _opaque(smem_descriptor_to_int(fixed.iterator) + Int64(cute.crd2idx((0, 0, 0, stage), fixed.layout)))
        return [
            cute.make_tensor(int_to_smem_descriptor(base + Int64(off)), layout)
            for off, layout in zip(k_offsets, k_layouts, strict=True)
        ]
    halves = llvm.inline_asm(
        llvm.StructType.get_literal([cutlass.Int32.mlir_type, cutlass.Int32.mlir_type]),
        [smem_descriptor_to_int(fixed.iterator).ir_value()],
        "mov.b64 {$0, $1}, $2;",
        "=r,=r,l",
        has_side_effects=False,
        is_align_stack=False,
    )
    low, high = (cutlass.Int32(llvm.extractvalue(cutlass.Int32.mlir_type, halves, [i])) for i in (0, 1))
    low = cute.arch.make_warp_uniform(low + cute.crd2idx((0, 0, 0, stage), fixed.layout))
    steps = []
    for off, layout in zip(k_offsets, k_layouts, strict=True):
        desc = llvm.inline_asm(
            Int64.mlir_type,
            [(low + off).ir_value(), high.ir_value()],
            "mov.b64 $0, {$1, $2};",
            "=l,r,r",
            has_side_effects=False,
            is_align_stack=False,
        )
        steps.append(cute.make_tensor(int_to_smem_descriptor(Int64(desc)), layout))
    return steps


@cute.jit
def gemm_steps(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    a_steps: list[cute.Tensor],
    b_steps: list[cute.Tensor],
    zero_init: cutlass.Constexpr[bool],
    wait: cutlass.Constexpr[int],
):
    """acc (+)= sum over k of a_steps[k] b_steps[k], as one committed wgmma group; then wait until at most ``wait``
    groups are in flight (-1: do not wait). The operands are per k-step (``k_steps`` of a fragment, or of
    ``fixed_descriptors`` taken outside a loop).

    The accumulate flag is set on a fresh MMA atom of the same op (one warpgroup's tiled MMA is one atom): set on
    the caller's object inside a run-time loop or branch, its value would escape that region.
    """
    mma = cute.make_mma_atom(tiled_mma.op)
    warpgroup.fence()
    mma.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(len(a_steps)):
        cute.gemm(mma, acc, a_steps[k], b_steps[k], acc)
        mma.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if cutlass.const_expr(wait >= 0):
        warpgroup.wait_group(wait)


@cute.jit
def gemm(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    zero_init: cutlass.Constexpr[bool],
    wait: cutlass.Constexpr[int],
):
    """acc (+)= A B over all k-steps of the fragments (MMA, MMA_M or MMA_N, MMA_K), as one committed wgmma group;
    then wait until at most ``wait`` groups are in flight (-1: do not wait). See ``gemm_steps``."""
    gemm_steps(tiled_mma, acc, k_steps(tCrA), k_steps(tCrB), zero_init, wait)


@cute.jit
def store_probs(acc_S: cute.Tensor, tOrP: cute.Tensor):
    """P in 16 bits into the P V MMA's A fragment. With 64-row warpgroup tiles the accumulator's element order,
    ((2, 2, N/8), 1, 1), is the A fragment's ((2, 2, 2), 1, N/16), so an element-wise store converts it."""
    store_converted(acc_S, cute.make_tensor(tOrP.iterator, acc_S.layout))


@cute.jit
def scores_by_fma(acc_S: cute.Tensor, coords: cute.Tensor, sQ: cute.Tensor, sK: cute.Tensor):
    """S = Q K^T again for this thread's elements of a warpgroup's (64, block_n) score tile, by fp32 FMAs from
    shared memory, without the tensor cores (and so per warp, not per warpgroup): the slow way back to scores a
    warp has overwritten (softmax.move_kept_max). ``coords`` is the (rows, cols) view of the accumulator's
    (row, col) coordinates, sQ the warpgroup's (64, D) Q tile, sK the (block_n, D) K stage."""
    s = acc_rows_cols(acc_S)
    rows, cols = cute.size(s.shape[0]), cute.size(s.shape[1])
    for r in cutlass.range_constexpr(rows):
        for c in cutlass.range_constexpr(cols):
            s[r, c] = Float32(0.0)
    for k in cutlass.range(cute.size(sQ.shape[1]), unroll=1):
        keys = [sK[coords[0, c][1], k].to(Float32) for c in range(cols)]
        for r in cutlass.range_constexpr(rows):
            q = sQ[coords[r, 0][0], k].to(Float32)
            for c in cutlass.range_constexpr(cols):
                s[r, c] = s[r, c] + q * keys[c]
