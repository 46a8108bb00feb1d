"""Compiled kernels: SPIR-V modules from shaders/ (its registry says what each one binds and
takes) made into pipelines of one device, and the activation formats each weight type's
products use.
"""
from __future__ import annotations

import os

from shaders.registry import (KERNELS, SUPER_BLOCKS, VARIANTS, WEIGHT_TYPES, KernelSpec,
                              variant_name)

from . import vk

# The activation rounding ggml's CPU backend applies before a product with each weight type
# (its vec_dot_type, type_traits_cpu in ggml-cpu.c). Blocks of 32 are rounded inside mul_mat
# (its ACT: 1 Q8_0, 2 Q8_1); the others by a quantize_act pass first (its FMT: 0 Q8_0,
# 2 Q8_K, 3 F16, 4 BF16). None: f32 as is.
ACT_INLINE = {"Q4_0": 1, "Q5_0": 1, "Q8_0": 1, "IQ4_NL": 1, "MXFP4": 1, "Q4_1": 2, "Q5_1": 2}
ACT_FORMAT = {"Q2_K": 2, "Q3_K": 2, "Q4_K": 2, "Q5_K": 2, "Q6_K": 2, "IQ4_XS": 2,
              "IQ3_XXS": 2, "IQ3_S": 2, "IQ2_XXS": 2, "IQ2_XS": 2, "IQ2_S": 2, "F16": 3,
              "BF16": 4, "F32": None}
ACT_BLOCK = {0: 32, 2: 256, 3: 4, 4: 4}
# mul_mat_vec rounds every format itself (its ACT: 1 Q8_0, 2 Q8_1, 3 Q8_K, 4 F16, 5 BF16),
# one chunk of MATVEC_CHUNK weights per lane (a quarter of a 256-weight super-block).
MATVEC_ACT = {"Q4_0": 1, "Q5_0": 1, "Q8_0": 1, "IQ4_NL": 1, "MXFP4": 1, "Q4_1": 2, "Q5_1": 2,
              "Q2_K": 3, "Q3_K": 3, "Q4_K": 3, "Q5_K": 3, "Q6_K": 3, "IQ4_XS": 3, "IQ3_XXS": 3,
              "IQ3_S": 3, "IQ2_XXS": 3, "IQ2_XS": 3, "IQ2_S": 3, "F16": 4, "BF16": 5, "F32": 0}
MATVEC_CHUNK = {t: 64 if t in SUPER_BLOCKS else 32 for t in MATVEC_ACT}
CM_K = 64                   # mul_mat_cm.comp's BK: its K must be a multiple
SPLIT_SUM_WG = 256          # split_sum.comp's floats a workgroup (64 lanes of four)


def compiled(kernel: str) -> bool:
    """Whether every variant of a kernel has its SPIR-V (the cooperative-matrix ones need
    glslangValidator at install time)."""
    from shaders import compile as shader_compile

    return all(os.path.exists(shader_compile.spv_path(v)) for v, (src, _, _) in VARIANTS.items()
               if src == KERNELS[kernel].source)


def load_spirv(variant: str) -> bytes:
    """The compiled module; compiled on the spot when missing or older than its source."""
    import shaders
    from shaders import compile as shader_compile

    source, defines, tool = VARIANTS[variant]
    path = shader_compile.spv_path(variant)
    src_dir = os.path.dirname(os.path.abspath(shaders.__file__))
    if not os.path.exists(path) or os.path.exists(os.path.join(src_dir, source)):
        try:
            path = shader_compile.compile_variant(variant, source, defines, tool)
        except RuntimeError:
            if not os.path.exists(path):
                raise
    with open(path, "rb") as f:
        return f.read()


DIV_RN_ID = 90      # shaders/include/round.glsl's specialization constant


class KernelCache:
    """Pipelines of one device, built on first use and keyed by variant + specialization."""

    def __init__(self, dev):
        self.dev = dev
        self._cache: dict[tuple, vk.Kernel] = {}

    def get(self, name: str, wtype: str | None = None, **spec: int) -> tuple[object, KernelSpec]:
        ks = KERNELS[name]
        if ks.typed and wtype not in (ks.types or WEIGHT_TYPES):
            raise ValueError(f"{name}: no variant for weight type {wtype}")
        names = dict(ks.spec)
        if "SG" in names:
            spec.setdefault("SG", self.dev.subgroup_size)
        unknown = set(spec) - set(names)
        if unknown:
            raise TypeError(f"{name}: unknown specialization constants {sorted(unknown)}")
        key = (name, wtype, tuple(sorted(spec.items())))
        k = self._cache.get(key)
        if k is None:
            variant = variant_name(name, wtype if ks.typed else None)
            consts = {names[n]: v for n, v in spec.items()}
            # round.glsl's DIV_RN (ignored by kernels without it): lavapipe's '/' rounds to
            # nearest; other drivers may approximate it (Vulkan allows 2.5 ulp)
            consts[DIV_RN_ID] = int(self.dev.info.kind != "cpu")
            k = vk.Kernel(self.dev, variant, load_spirv(variant), ks.n_buffers, ks.push_size,
                          consts)
            self._cache[key] = k
        return k, ks

    def close(self) -> None:
        for k in self._cache.values():
            k.close()
        self._cache = {}
