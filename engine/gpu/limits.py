"""Limits a driver puts on kernels beyond what Vulkan's device limits report, in one table.

Mesa's llvmpipe (lavapipe, the CPU driver) ends a shader's loops early: each subgroup of a
dispatch has one counter for every loop of the shader together, set to 65,535 and taken down
by one at each pass through a loop's end (a loop of n iterations costs n + 1, a loop reached
with every lane masked off still 1); at zero every loop exits after its current iteration,
and the kernel's result is silently wrong (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS). Loops
with a constant trip count that the compiler unrolls cost nothing.

So on such a driver every kernel whose loops grow with the vocabulary, the context, the
experts or a state is dispatched wide enough, and the context the engine accepts is bounded,
that no subgroup reaches the limit. The worst case of each, in ticks per subgroup:

    argmax, logprobs      ceil(n_vocab / wg) + 2 * top_k + small    wg: Tuning.reduce_wg
    attention (per token) 3 * (ceil(n_ctx / subgroup) + 1)          bounds max_ctx
    attn_split            ceil(n_ctx / splits) + 8                  Tuning.decode_splits
    flash_attn            2 * ceil(n_ctx / BC) + 3                  tile loads unrolled
    mul_mat, mul_mat_id   ceil(K / 64) + 1
    mul_mat_moe           walks * (ceil(K / 64) + 3) + 1            walks per workgroup
                                                                    bounded (Builder)
    moe_router            ~ top_k * n_expert / 8
    rms_norm              2 * ceil(n_embd / wg) + 3
    delta_net             n_tokens + 1 (a pass's width)

tests/engine/gpu/test_loop_limits.py runs those whose walks grow with the vocabulary, the
context, the experts or a row's length at the largest the device takes; the README's "Driver
limits" has the whole table.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import vk

MAX_CTX = 1 << 20           # the most context any device is given


@dataclass(frozen=True)
class DriverLimits:
    loop_ticks: int = 0         # loop-end passes a subgroup may make in one dispatch; 0: any
    max_ctx: int = MAX_CTX      # the longest context whose kernels stay within them


# The per-token attention kernel (3 walks of n_ctx / 8 positions on lavapipe's subgroup of 8)
# stays under 65,535 up to 174,752 positions: the context is bounded at the power of two below
LLVMPIPE = DriverLimits(loop_ticks=65535, max_ctx=1 << 17)
NONE = DriverLimits()


def for_device(info: vk.DeviceInfo) -> DriverLimits:
    """The limits of the driver behind a device (llvmpipe names itself in its device name)."""
    return LLVMPIPE if info.kind == "cpu" and info.name.startswith("llvmpipe") else NONE
