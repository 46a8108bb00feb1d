"""The mistral3 architecture (the text part of Mistral Small 3.1 and later, Ministral 3,
Devstral, Magistral GGUFs), as llama.cpp defines it: llama's graph (engine/arch/llama.py:
adjacent pairs rotated, rope_freqs where the file has them), YaRN from the file's keys
(its betas and log multiplier: engine/arch/config.py), and Llama 4's attention temperature:
q times 1 + s ln(1 + floor(pos / n)) after its rope, s the file's
`attention.temperature_scale` and n the rope's original context length."""
from __future__ import annotations

from dataclasses import dataclass

from ..formats.gguf_file import GGUFFile
from . import llama
from .llama import forward  # noqa: F401  (the llama graph)


@dataclass(frozen=True)
class Config(llama.Config):
    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        scale = float(g.get(f"{g.arch}.attention.temperature_scale", 0.0) or 0.0)
        return {**super().extra(g, common), "attn_temp_scale": scale,
                "attn_temp_floor": common["rope"].n_ctx_orig}

    def problems(self) -> list[str]:
        extra = super().problems()
        if self.attn_temp_scale and self.attn_temp_floor <= 0:
            extra.append(f"attention temperature over {self.attn_temp_floor} positions")
        return extra
