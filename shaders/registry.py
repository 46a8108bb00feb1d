"""The kernel registry: one entry per shader, with its push constants declared once.

Each `KernelSpec` names its GLSL source in this folder, how many storage buffers it binds
(bindings 0..n-1, in order), the fields of its push-constant block (tests check them against
the GLSL), its specialization constants by name and id, whether it comes in one variant
per weight type, and where it binds the step buffer (STEP_FIELDS, include/step.glsl).
`VARIANTS` is the table compile.py builds. Plain data: the build step and the engine
(engine/gpu/kernels.py) both import it, and it imports neither.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

WEIGHT_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K",
                "Q5_1", "BF16", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "MXFP4",
                "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S")
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
SUPER_BLOCKS = K_QUANTS + ("IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S")       # 256-weight super-blocks: rows of 256k weights
                                            # (include/types.glsl's SUPER_BLOCK)
MATVECQ_TYPES = ("Q4_K", "Q6_K", "Q4_0", "Q8_0", "MXFP4")   # mul_mat_vecq's readers
CM2_TYPES = ("F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K")           # mul_mat_cm2's decoders
CM2_GROUPS = ("Q8_0", "Q4_0")      # ... that read eight blocks as one group (its GROUP)
# the quantized types dequant_f16 turns to f16 rows for the prefill products (BF16 and F32
# keep their own path: f16 cannot hold their range)
PREDECODE_TYPES = tuple(t for t in WEIGHT_TYPES if t not in ("F32", "F16", "BF16"))
_FMT = {"u32": "I", "f32": "f"}
# the grouped expert products' push constants (moe_tile.glsl reads the last three)
MOE_PUSH = (("n_in", "u32"), ("n_out", "u32"), ("n_used", "u32"), ("expert_base", "u32"),
            ("n_experts", "u32"), ("n_expert", "u32"))
MOE_MAX_EXPERT, MOE_MAX_USED = 512, 32      # moe_router.comp's MAX_EXPERT, route.glsl's

# The step buffer: the small host-visible buffer of per-submit values (RunState.set_step writes
# it per decoded token and prefill chunk, so recorded command buffers stay valid). Declared in
# GLSL once, include/step.glsl, at the binding a kernel's spec names (KernelSpec.step).
STEP_FIELDS = (("pos0", "u32"), ("n_past", "u32"), ("bidir", "u32"), ("step_pad1", "u32"))
STEP_BYTES = 4 * len(STEP_FIELDS)
# then one u32 per token of the pass, read by the kernels specialized with SEQS = 1: the cache
# slot where that token's sequence starts (packed sequences, engine/residency/embed.py)
STEP_TOKENS = "seq_first"


def pack_step(pos0: int, n_past: int, bidir: bool = False) -> bytes:
    """The step buffer's bytes (bidir: the pass's tokens see each other both ways)."""
    values = dict(pos0=pos0, n_past=n_past, bidir=int(bidir), step_pad1=0)
    return _pack(STEP_FIELDS, values, "step buffer")


def _pack(fields: tuple[tuple[str, str], ...], values: dict, what: str) -> bytes:
    names = [n for n, _ in fields]
    if set(values) != set(names):
        raise TypeError(f"{what}: fields are {names}, got {sorted(values)}")
    return struct.pack("<" + "".join(_FMT[t] for _, t in fields), *[values[n] for n in names])


@dataclass(frozen=True)
class KernelSpec:
    source: str
    n_buffers: int
    push: tuple[tuple[str, str], ...]       # (field, "u32" | "f32"), in GLSL order
    spec: tuple[tuple[str, int], ...] = ()  # (name, constant_id); "SG" is the subgroup size,
                                            # "WG" a workgroup of whole subgroups
    typed: bool = False                     # one variant per entry of WEIGHT_TYPES
    writes: tuple[int, ...] = ()            # bindings the kernel writes (for barriers)
    coopmat: bool = False                   # uses VK_KHR_cooperative_matrix: compiled by
                                            # glslang (the glslc of Debian 12 lacks it)
    coopmat2: bool = False                  # uses VK_NV_cooperative_matrix2: compiled by a
                                            # glslang of 15 or later, for Vulkan 1.3
    step: int | None = None                 # binding of the step buffer, if it reads it
    types: tuple[str, ...] = ()             # typed: only these weight types (else all)
    dot4: bool = False                      # uses SPV_KHR_integer_dot_product (the device's
                                            # VK_KHR_shader_integer_dot_product)

    @property
    def push_size(self) -> int:
        return 4 * len(self.push)

    def pack(self, **values) -> bytes:
        return _pack(self.push, values, f"{self.source}: push constants")


U, F = "u32", "f32"
# the delta-rule kernels' heads (include/delta.glsl) and where their gate inputs sit
DELTA_HEADS = (("n_head", U), ("n_head_k", U), ("tiled", U))
DELTA_GATES = (("gate_stride", U), ("gate_group", U), ("beta_offset", U), ("alpha_offset", U))
KERNELS: dict[str, KernelSpec] = {
    "mul_mat": KernelSpec(
        "mul_mat.comp", 3,
        (("n_in", U), ("n_out", U), ("n_tokens", U), ("x_offset", U), ("y_offset", U),
         ("row_offset", U), ("y_stride", U)),
        (("WG", 0), ("ROWS", 1), ("NT", 2), ("ACC", 3), ("ACT", 4)), typed=True, writes=(2,)),
    "mul_mat_vec": KernelSpec(
        "mul_mat_vec.comp", 4,
        (("n_in", U), ("n_out", U), ("x_offset", U), ("y_offset", U), ("eps", F)),
        (("WG", 0), ("ROWS", 1), ("ACC", 2), ("ACT", 3), ("XFORM", 4), ("MAP", 5)), typed=True,
        writes=(2,)),
    "mul_mat_vecq": KernelSpec(
        "mul_mat_vecq.comp", 11,
        (("n_in", U), ("n_out", U), ("x_offset", U), ("y_offset", U), ("eps", F), ("row2", U),
         ("head_dim", U), ("freq_base", F), ("freq_scale", F), ("kv_row", U),
         ("expert_base", U), ("n_experts", U)),
        (("WG", 0), ("ROWS", 1), ("ACC", 2), ("XFORM", 3), ("KMAX", 4), ("UNROLL", 5),
         ("PAIR", 6), ("ROPE", 7), ("TABLE", 8), ("OUT16", 9), ("EXPERTS", 10), ("SUM", 11),
         ("BIAS", 12), ("ROUTE", 13), ("ROUTE_N", 14),
         ("HNORM", 15), ("GATED", 16)),
        typed=True, writes=(2,),
        types=MATVECQ_TYPES, dot4=True, step=5),
    "mul_mat_cm": KernelSpec(
        "mul_mat_cm.comp", 3,
        (("n_in", U), ("n_out", U), ("n_tokens", U), ("x_offset", U), ("y_offset", U),
         ("y_stride", U)),
        (("ACC", 0), ("BM", 1), ("BN", 2)), typed=True, writes=(2,), coopmat=True),
    "mul_mat_cm2": KernelSpec(
        "mul_mat_cm2.comp", 3,
        (("n_in", U), ("n_out", U), ("n_tokens", U), ("x_offset", U), ("y_offset", U),
         ("y_stride", U), ("k_split", U), ("y_slice", U)),
        (("WG", 0), ("BM", 1), ("BN", 2), ("ACC", 3), ("X16", 4), ("AHEAD", 5), ("F16DEC", 6),
         ("ACC16", 7), ("UNROLL", 8), ("GROUP", 9)),
        typed=True, writes=(2,), coopmat2=True, types=CM2_TYPES),
    "mul_mat_cm2s": KernelSpec(
        "mul_mat_cm2s.comp", 3,
        (("n_in", U), ("n_out", U), ("n_tokens", U), ("x_offset", U), ("y_offset", U),
         ("y_stride", U)),
        (("WG", 0), ("BM", 1), ("BN", 2), ("ACC", 3)), typed=True, writes=(2,),
        coopmat2=True),
    "mul_mat_id": KernelSpec(
        "mul_mat_id.comp", 4,
        (("n_in", U), ("n_out", U), ("n_used", U), ("expert_base", U), ("n_experts", U)),
        (("WG", 0), ("ROWS", 1), ("ACT", 2), ("X_SLOT", 3)), typed=True, writes=(3,)),
    "moe_router": KernelSpec("moe_router.comp", 3, (("n_expert", U), ("n_used", U)),
                             (("SG", 0), ("NORM", 1), ("SOFTMAX_K", 2)), writes=(1, 2)),
    "moe_combine": KernelSpec("moe_combine.comp", 3,
                              (("n_embd", U), ("n_used", U), ("n", U)), writes=(2,)),
    "moe_group": KernelSpec("moe_group.comp", 3, (("n_slots", U),), (("SG", 0),),
                            writes=(1, 2)),
    "moe_tiles": KernelSpec("moe_tiles.comp", 1, (("n_expert", U), ("bn", U)), (),
                            writes=(0,)),
    "mul_mat_moe": KernelSpec(
        "mul_mat_moe.comp", 5, MOE_PUSH,
        (("WG", 0), ("ROWS", 1), ("NT", 2), ("ACT", 3), ("X_SLOT", 4)), typed=True,
        writes=(4,)),
    "mul_mat_moe_cm": KernelSpec(
        "mul_mat_moe_cm.comp", 5, MOE_PUSH,
        (("BM", 0), ("BN", 1), ("X_SLOT", 2), ("PREFETCH", 3), ("X16", 4)), typed=True,
        writes=(4,), coopmat=True),
    "mul_mat_moe_cm2": KernelSpec(
        "mul_mat_moe_cm2.comp", 5, MOE_PUSH,
        (("WG", 0), ("BM", 1), ("BN", 2), ("X_SLOT", 3), ("F16DEC", 4), ("X16", 5),
         ("ACC16", 6)), typed=True,
        writes=(4,), coopmat2=True, types=CM2_TYPES),
    "get_rows": KernelSpec("get_rows.comp", 3,
                           (("n_cols", U), ("n_rows", U), ("scale", F), ("row_base", U),
                            ("part_rows", U)),
                           typed=True, writes=(2,)),
    "dequant_f16": KernelSpec("dequant_f16.comp", 2, (("n_in", U), ("n_rows", U), ("row0", U)),
                              typed=True, writes=(1,), types=PREDECODE_TYPES),
    "rms_norm": KernelSpec("rms_norm.comp", 4,
                           (("n_cols", U), ("n_rows", U), ("eps", F), ("x_offset", U)),
                           (("WG", 0), ("ADD", 1), ("OUT16", 2)), writes=(2,)),
    "layer_norm": KernelSpec("layer_norm.comp", 4, (("n_cols", U), ("n_rows", U), ("eps", F)),
                             (("WG", 0),), writes=(3,)),
    "pool2d": KernelSpec("pool2d.comp", 2, (("n_cols", U), ("side", U)), (("K", 0),),
                         writes=(1,)),
    "rope_qkv": KernelSpec("rope_qkv.comp", 9,
                           (("n_head", U), ("n_head_kv", U), ("head_dim", U), ("n_dims", U),
                            ("n_tokens", U), ("freq_base", F), ("freq_scale", F),
                            ("temp_scale", F), ("temp_floor", U), ("eps", F)),
                           (("NEOX", 0), ("TABLE", 1), ("TEMP", 2), ("SEQS", 3), ("NORM", 4),
                            ("WG", 5)),
                           writes=(0, 3, 4), step=5),
    # the attention kernels' options (include/attn.glsl): softcap (0: none), and SINKS with
    # the sinks buffer bound last; SEQS = 1 (rope_qkv and the prefill paths): packed sequences,
    # each token bounded by step.seq_first
    "attention": KernelSpec("attention.comp", 6,
                            (("n_head", U), ("n_head_kv", U), ("n_tokens", U), ("window", U),
                             ("scale", F), ("softcap", F)),
                            (("SG", 0), ("HD", 1), ("GGML", 2), ("SINKS", 3), ("SEQS", 4)),
                            writes=(3,), step=4),
    "attn_mask": KernelSpec("attn_mask.comp", 3, (("n_tokens", U), ("stride", U), ("window", U)),
                            (("WG", 0), ("BR", 1), ("BC", 2), ("SEQS", 3)), writes=(0, 1), step=2),
    "flash_attn": KernelSpec("flash_attn.comp", 8,
                             (("n_head", U), ("n_head_kv", U), ("n_tokens", U), ("stride", U),
                              ("scale", F), ("softcap", F)),
                             (("WG", 0), ("HD", 1), ("BR", 2), ("BC", 3), ("LP", 4), ("GGML", 5),
                              ("SKIP", 6), ("SINKS", 7)), writes=(3,), step=6),
    "flash_attn_cm": KernelSpec("flash_attn_cm.comp", 6,
                                (("n_head", U), ("n_head_kv", U), ("n_tokens", U),
                                 ("window", U), ("scale", F), ("softcap", F)),
                                (("HD", 0), ("SINKS", 1), ("SEQS", 2)), writes=(3,), coopmat=True,
                                step=4),
    "flash_attn_cm2": KernelSpec("flash_attn_cm2.comp", 6,
                                 (("n_head", U), ("n_head_kv", U), ("n_tokens", U),
                                  ("window", U), ("scale", F), ("softcap", F)),
                                 (("WG", 0), ("HD", 1), ("BR", 2), ("BC", 3), ("SINKS", 4),
                                  ("SEQS", 5)), writes=(3,), coopmat2=True, step=4),
    "attn_split": KernelSpec("attn_split.comp", 8,
                             (("n_head", U), ("n_head_kv", U), ("n_ctx", U), ("window", U),
                              ("n_split", U), ("min_chunk", U), ("scale", F), ("softcap", F)),
                             (("WG", 0), ("HD", 1), ("LP", 2), ("PASS", 3), ("SINKS", 4)),
                             writes=(3, 4, 5), step=6),
    "attn_decode": KernelSpec("attn_decode.comp", 9,
                              (("n_head", U), ("n_head_kv", U), ("window", U), ("n_split", U),
                               ("min_chunk", U), ("scale", F), ("softcap", F)),
                              (("WG", 0), ("HD", 1), ("LP", 2), ("SINKS", 3), ("QH", 4),
                               ("AHEAD", 5)),
                              writes=(3, 4, 7, 8), step=5),
    "attn_combine": KernelSpec("attn_combine.comp", 2, (("head_dim", U), ("n_split", U)),
                               writes=(1,)),
    "quantize_act": KernelSpec("quantize_act.comp", 2,
                               (("n_cols", U), ("n_rows", U), ("x_offset", U)),
                               (("FMT", 0),), writes=(1,)),
    "to_f16": KernelSpec("to_f16.comp", 2, (("n", U), ("x_offset", U)), writes=(1,)),
    "split_sum": KernelSpec("split_sum.comp", 2, (("n", U), ("slices", U)), (("ACC", 0),),
                            writes=(1,)),
    "silu_mul": KernelSpec("silu_mul.comp", 4, (("n", U),),
                           (("GELU", 0), ("CLAMPED", 1), ("GATED", 2), ("OUT16", 3),
                            ("V4", 4)),
                           writes=(2,)),
    "add": KernelSpec("add.comp", 3, (("n", U), ("b_len", U), ("scale", F)), writes=(2,)),
    "scale": KernelSpec("scale.comp", 1, (("n", U), ("scale", F)), writes=(0,)),
    "add_id": KernelSpec("add_id.comp", 4, (("n_cols", U), ("n", U)), writes=(3,)),
    "softcap": KernelSpec("softcap.comp", 1, (("n", U), ("cap", F)), writes=(0,)),
    "argmax": KernelSpec("argmax.comp", 2, (("n", U), ("x_offset", U)), (("WG", 0),),
                         writes=(1,)),
    # log-sum-exp and the k best of one logits row (k <= 20: logprobs.comp's TOP_MAX)
    "logprobs": KernelSpec("logprobs.comp", 2, (("n", U), ("x_offset", U), ("k", U),
                                                ("o_offset", U)), (("WG", 0),), writes=(1,)),
    "mul": KernelSpec("mul.comp", 3,
                      (("n_cols", U), ("n_rows", U), ("a_offset", U), ("a_stride", U),
                       ("b_offset", U), ("b_stride", U)), (("SIGMOID", 0), ("BCAST", 1)),
                      writes=(2,)),
    "cpy": KernelSpec("cpy.comp", 2,
                      (("n_cols", U), ("n_rows", U), ("src_offset", U), ("src_stride", U),
                       ("dst_offset", U), ("dst_stride", U)), writes=(1,)),
    "concat": KernelSpec("concat.comp", 3,
                         (("ne00", U), ("ne10", U), ("ne1", U), ("ne2", U), ("a_nb0", U),
                          ("a_nb1", U), ("a_nb2", U), ("b_nb0", U), ("b_nb1", U), ("b_nb2", U),
                          ("a_offset", U), ("b_offset", U)),
                         (("TILED", 0), ("TSRC", 1)), writes=(2,)),
    "ssm_conv": KernelSpec("ssm_conv.comp", 3, (("n_channels", U), ("n_tokens", U), ("width", U)),
                           writes=(2,)),
    # gated delta-net layers (qwen3next, qwen35): the short convolution with silu, q/k L2 norms
    # and its state; the delta rule per token (delta_net) or per chunk (delta_chunk_prep, then
    # delta_chunk); the gated RMS norm of its output
    "delta_conv": KernelSpec("delta_conv.comp", 4,
                             (("n_channels", U), ("n_tokens", U), ("width", U), ("head_dim", U),
                              ("n_norm", U), ("eps", F)),
                             (("WG", 0), ("TB", 1)), writes=(2, 3)),
    "delta_net": KernelSpec("delta_net.comp", 7, DELTA_HEADS + (
                                ("n_tokens", U), ("qkv_stride", U), ("k_offset", U),
                                ("v_offset", U)) + DELTA_GATES + (("scale", F),),
                            (("WG", 0), ("L", 1), ("HD", 2)), writes=(5, 6)),
    "delta_chunk_prep": KernelSpec("delta_chunk_prep.comp", 6, DELTA_HEADS + (
                                       ("n_tokens", U), ("qkv_stride", U), ("k_offset", U))
                                   + DELTA_GATES + (("scale", F),),
                                   (("WG", 0), ("C", 1), ("HD", 2), ("DT", 3)), writes=(5,)),
    "delta_chunk": KernelSpec("delta_chunk.comp", 4, DELTA_HEADS + (
                                  ("n_tokens", U), ("qkv_stride", U), ("k_offset", U),
                                  ("v_offset", U), ("scale", F)),
                              (("WG", 0), ("C", 1), ("HD", 2), ("JB", 3), ("TT", 4)),
                              writes=(2, 3)),
    "norm_gated": KernelSpec("norm_gated.comp", 4, (("n_cols", U), ("n_rows", U), ("eps", F)),
                             (("WG", 0),), writes=(3,)),
}


def variant_name(kernel: str, wtype: str | None = None) -> str:
    return f"{kernel}_{wtype}" if wtype else kernel


def _variants() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """variant -> (source, defines, compiler: "glslc", "glslang" or "glslang2")."""
    out = {}
    for name, ks in KERNELS.items():
        tool = "glslang2" if ks.coopmat2 else "glslang" if ks.coopmat else "glslc"
        defs = () if ks.step is None else (f"STEP_BINDING={ks.step}",)
        if ks.typed:
            for t in ks.types or WEIGHT_TYPES:
                out[variant_name(name, t)] = (ks.source, (f"TYPE_{t}",) + defs, tool)
        else:
            out[name] = (ks.source, defs, tool)
    return out


VARIANTS = _variants()
