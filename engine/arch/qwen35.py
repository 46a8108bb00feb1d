"""The hybrid gated delta-net architectures qwen3next (Qwen3-Next), qwen35 (Qwen3.5 dense) and
qwen35moe (Qwen3.5 MoE), as llama.cpp defines them in GGUF (src/models/qwen3next.cpp,
qwen35.cpp, qwen35moe.cpp, delta-net-base.cpp).

Layers are of two kinds. Most are gated delta-net layers (linear attention with a recurrent
state); every `full_attention_interval`-th one (or those `attention.recurrent_layers` marks
false) is full attention. Every layer is

    x = x + mixer(rms_norm(x, attn_norm))
    x = x + ffn(rms_norm(x, post_attention_norm))

and the model ends in rms_norm(output_norm) and the output projection. The GGUF norm weights
are plain multipliers (the converter already added Qwen's 1 to its zero-centred weights; the
delta-net's ssm_norm is stored as is).

Gated delta-net (per token t; H_k = ssm.group_count key heads, H_v = ssm.time_step_rank value
heads, d = ssm.state_size = head_k_dim = head_v_dim, d_inner = ssm.inner_size = H_v * d):
    qkv = attn_qkv @ x                 [2 H_k d + H_v d]  (the conv channels: q | k | v)
    z = attn_gate @ x                  [H_v d]
    qkv = silu(causal depthwise conv of ssm.conv_kernel taps over (conv state, qkv))
    q, k = l2-normalised per head: x / sqrt(sum(x^2) + rms_eps)
    beta = sigmoid(b)    g = softplus(a + ssm_dt.bias) * ssm_a      (ssm_a = -exp(A_log))
        qwen35*: b = ssm_beta @ x, a = ssm_alpha @ x                [H_v] each
        qwen3next: ssm_ba @ x, per key head [b (H_v/H_k values), a (H_v/H_k values)]
    per value head h, reading key head kh(h), state S [d_k x d_v] (float32):
        S = exp(g) S;  delta = beta (v - S^T k);  S = S + k delta^T;  o = S^T q / sqrt(d)
        kh(h) = h // (H_v / H_k) in qwen3next (grouped), h % H_k in qwen35* (tiled: the
        converter reorders the value heads so that ggml's broadcast applies)
    o = rms_norm(o per head, ssm_norm) * silu(z);   out = ssm_out @ o
The conv state is the last ssm.conv_kernel - 1 qkv inputs of each channel.

Full attention: attn_q gives per head [q (head_dim) | gate (head_dim)]; q and k get per-head
RMS norms (attn_q_norm, attn_k_norm), a partial NeoX rope over rope.dimension_count dims
(qwen35*: ggml's interleaved multi-section rope with rope.dimension_sections; text
positions make it the NeoX rope, see rope_positions), attention at 1/sqrt(head_dim), the
output multiplied by sigmoid(gate), then attn_output.

FFN: qwen35 a SwiGLU (ffn_gate, ffn_up, ffn_down). qwen3next and qwen35moe: softmax router
over `expert_count` experts, top `expert_used_count`, weights renormalised to sum 1, SwiGLU
experts (ffn_{gate,up,down}_exps), plus a shared SwiGLU expert (ffn_{gate,up,down}_shexp)
scaled by sigmoid(ffn_gate_inp_shexp . x).

`nextn_predict_layers` multi-token-prediction blocks follow the trunk in block_count; they
are not run (llama.cpp runs them only as a draft head), so n_layer excludes them.

On the GPU a delta-net layer is its projections, then three ops of engine/gpu/builder.py:
delta_conv (conv, silu, the q/k norms, the conv state moved on), delta_net (the gates and
the recurrence, token by token or by chunks) and norm_gated; both states live in the
RunState (conv_state, delta_state: "recurrent" bytes that residency captures on release).
The attention gate and the shared expert's are `mul` with a sigmoid.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..formats.gguf_file import GGUFFile, ModelFileError
from . import blocks, config
from ..gpu.builder import Builder, DeltaGates, DeltaHeads
from ..gpu.runstate import Extra, RunState

ARCHS = ("qwen3next", "qwen35", "qwen35moe")
MOE_ARCHS = ("qwen3next", "qwen35moe")


@dataclass(frozen=True)
class Config(config.Config):
    arch: str
    n_layer_nextn: int             # MTP blocks after the trunk (not run)
    kv_layers: tuple[int, ...]     # full-attention layers
    delta_layers: tuple[int, ...]  # gated delta-net layers
    conv_kernel: int               # ssm.conv_kernel: taps of the causal conv
    ssm_d_inner: int               # ssm.inner_size: H_v * head_v_dim
    ssm_d_state: int               # ssm.state_size: head_k_dim (= head_v_dim)
    n_k_heads: int                 # ssm.group_count
    n_v_heads: int                 # ssm.time_step_rank
    rope_sections: tuple[int, ...]  # qwen35*: rope.dimension_sections (4); qwen3next: ()
    n_expert: int = 0              # 0: dense SwiGLU (qwen35); n_ff is then its length
    n_expert_used: int = 0
    n_ff_shexp: int = 0            # shared expert's length (MoE)
    legacy_ssm_in: bool = False    # an old qwen3next file with fused ssm_in (not read)
    fused_gate_up_exps: bool = False   # ffn_gate_up_exps instead of gate and up (not read)
    # the shared expert's gate as converted from HF's Linear(n_embd, 1): ggml [n_embd, 1]
    # (llama.cpp takes it as its [n_embd]); False: stored 1-D
    shexp_gate_2d: bool = False

    DEFAULTS = {"context_length": 262144, "rope.freq_base": 10000000.0,
                "attention.layer_norm_rms_epsilon": None}

    @classmethod
    def ff_key(cls, g: GGUFFile) -> str:
        # MoE files may have no feed_forward_length (llama.cpp reads it as optional)
        return "feed_forward_length" if g.arch == "qwen35" else "expert_feed_forward_length"

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        a = g.arch
        if a not in ARCHS:
            raise ModelFileError(g.path, f"architecture {a!r} is not one of {', '.join(ARCHS)}",
                                 "architecture")
        n_all = common["n_layer"]
        nextn = int(g.get(f"{a}.nextn_predict_layers", 0) or 0)
        n_layer = n_all - nextn
        recurrent = g.get(f"{a}.attention.recurrent_layers")
        if recurrent is not None:
            if not isinstance(recurrent, (list, tuple)) or len(recurrent) < n_layer:
                raise ModelFileError(g.path, f"{a}.attention.recurrent_layers must list "
                                             f"{n_all} layers", "corrupt")
            delta = tuple(i for i in range(n_layer) if recurrent[i])
        else:
            interval = int(g.get(f"{a}.full_attention_interval", 4))
            if interval <= 0:
                raise ModelFileError(g.path, f"{a}.full_attention_interval {interval}",
                                     "corrupt")
            delta = tuple(i for i in range(n_layer) if (i + 1) % interval != 0)
        ssm = {k: int(g.require(f"{a}.ssm.{k}"))
               for k in ("conv_kernel", "inner_size", "state_size", "time_step_rank",
                         "group_count")}
        sections: tuple[int, ...] = ()
        if a != "qwen3next":
            s = g.require(f"{a}.rope.dimension_sections")
            sections = tuple(int(v) for v in (s if isinstance(s, (list, tuple)) else [s]))
            sections = (sections + (0, 0, 0, 0))[:4]
        moe = {}
        if a in MOE_ARCHS:
            n_used = int(g.require(f"{a}.expert_used_count"))
            moe = dict(n_expert=int(g.require(f"{a}.expert_count")), n_expert_used=n_used,
                       # llama.cpp: without it, feed_forward_length
                       n_ff_shexp=int(g.get(f"{a}.expert_shared_feed_forward_length",
                                            g.get(f"{a}.feed_forward_length", 0)) or 0))
        first = delta[0] if delta else None
        return dict(
            arch=a, n_layer=n_layer, n_layer_nextn=nextn,
            kv_layers=tuple(i for i in range(n_layer) if i not in delta), delta_layers=delta,
            conv_kernel=ssm["conv_kernel"], ssm_d_inner=ssm["inner_size"],
            ssm_d_state=ssm["state_size"], n_k_heads=ssm["group_count"],
            n_v_heads=ssm["time_step_rank"], rope_sections=sections,
            legacy_ssm_in=first is not None and f"blk.{first}.attn_qkv.weight" not in g.tensors
            and f"blk.{first}.ssm_in.weight" in g.tensors,
            fused_gate_up_exps="blk.0.ffn_gate_up_exps.weight" in g.tensors,
            shexp_gate_2d=len(getattr(g.tensors.get("blk.0.ffn_gate_inp_shexp.weight"),
                                      "shape", ())) == 2, **moe)

    # -- derived sizes ----------------------------------------------------------------------
    @property
    def head_v_dim(self) -> int:
        return self.ssm_d_inner // max(self.n_v_heads, 1)

    @property
    def key_dim(self) -> int:
        """q and k channels of the conv: H_k * head_k_dim each."""
        return self.n_k_heads * self.ssm_d_state

    @property
    def conv_channels(self) -> int:
        """The qkv channels the conv runs over: q | k | v."""
        return 2 * self.key_dim + self.ssm_d_inner

    @property
    def moe(self) -> bool:
        return self.n_expert > 0

    @property
    def grouped_v_heads(self) -> bool:
        """Value head h reads key head h // (H_v / H_k) (qwen3next), else h % H_k."""
        return self.arch == "qwen3next"

    def k_head(self, v_head: int) -> int:
        """The key (and query) head value head v_head reads."""
        if self.grouped_v_heads:
            return v_head // (self.n_v_heads // self.n_k_heads)
        return v_head % self.n_k_heads

    def layer_kinds(self) -> tuple[str, ...]:
        """"attention" or "delta" for each trunk layer."""
        return tuple("delta" if i in self.delta_layers else "attention"
                     for i in range(self.n_layer))

    def rope_positions(self) -> tuple[bool, ...]:
        """For each rotated pair i < rope_dims / 2, whether it turns by the token's position
        (True) or stays put (False). ggml's interleaved multi-section rope (qwen35*) gives
        pair i section (i % sum(sections)) and rotates it by the text position in sections
        t, h, w, by the extra position (0 for text) otherwise; with Qwen3.5's sections
        [11, 11, 10, 0] every pair turns, as in a NeoX rope."""
        n = self.rope_dims // 2
        if not self.rope_sections:
            return (True,) * n
        t, h, w, _ = self.rope_sections
        total = max(sum(self.rope_sections), 1)
        out = []
        for i in range(n):
            s = i % total
            out.append((s % 3 == 1 and s < 3 * h) or (s % 3 == 2 and s < 3 * w)
                       or (s % 3 == 0 and s < 3 * t))
        return tuple(out)

    def rope_components(self) -> tuple[int, ...]:
        """Per rotated pair, the position component it turns by (0 t, 1 h, 2 w, 3 e: ggml's
        interleaved multi-section rope); images give their tokens other h and w than t
        (engine/vision/positions.py)."""
        from ..vision.positions import imrope_components

        if not self.rope_sections:                     # qwen3next: one position
            return (0,) * (self.rope_dims // 2)
        return imrope_components(self.rope_sections, self.rope_dims // 2)

    def conv_state_bytes(self) -> int:
        """One delta-net layer's conv state: conv_kernel - 1 inputs of every channel, f32."""
        return 4 * (self.conv_kernel - 1) * self.conv_channels

    def delta_state_bytes(self) -> int:
        """One delta-net layer's recurrent state: a head_k_dim x head_v_dim matrix per value
        head, f32 (llama.cpp's n_embd_s: ssm_d_state * ssm_d_inner)."""
        return 4 * self.ssm_d_state * self.ssm_d_inner

    def recurrent_bytes(self) -> int:
        """Every delta-net layer's conv and recurrent state, for one sequence."""
        return len(self.delta_layers) * (self.conv_state_bytes() + self.delta_state_bytes())

    def kv_bytes(self, n_ctx: int) -> int:
        """K and V of the attention layers at f16 for n_ctx positions."""
        return 2 * 2 * n_ctx * self.n_head_kv * self.head_dim * len(self.kv_layers)

    # -- tensors ----------------------------------------------------------------------------
    def attention_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """A full-attention layer: Q and its gate in one projection, Q/K norms."""
        shapes = super().attention_shapes(layer, qk_norm="head")
        shapes[f"blk.{layer}.attn_q.weight"] = (self.n_embd, 2 * self.n_head * self.head_dim)
        return shapes                                                  # per head: q | gate

    def delta_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """A gated delta-net layer (its input norm included)."""
        b, e, hv = f"blk.{layer}.", self.n_embd, self.n_v_heads
        shapes = {
            b + "attn_norm.weight": (e,),
            b + "attn_qkv.weight": (e, self.conv_channels),
            b + "attn_gate.weight": (e, self.ssm_d_inner),
            b + "ssm_conv1d.weight": (self.conv_kernel, self.conv_channels),
            b + "ssm_dt.bias": (hv,),
            b + "ssm_a": (hv,),
            b + "ssm_norm.weight": (self.head_v_dim,),
            b + "ssm_out.weight": (self.ssm_d_inner, e),
        }
        if self.arch == "qwen3next":
            shapes[b + "ssm_ba.weight"] = (e, 2 * hv)
        else:
            shapes.update({b + "ssm_beta.weight": (e, hv), b + "ssm_alpha.weight": (e, hv)})
        return shapes

    def ffn_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        b, e, f = f"blk.{layer}.", self.n_embd, self.n_ff
        shapes = {b + "post_attention_norm.weight": (e,)}
        if not self.moe:
            shapes.update({b + "ffn_gate.weight": (e, f), b + "ffn_up.weight": (e, f),
                           b + "ffn_down.weight": (f, e)})
            return shapes
        x, fs = self.n_expert, self.n_ff_shexp
        shapes.update({
            b + "ffn_gate_inp.weight": (e, x),
            b + "ffn_gate_exps.weight": (e, f, x),
            b + "ffn_up_exps.weight": (e, f, x),
            b + "ffn_down_exps.weight": (f, e, x),
            b + "ffn_gate_inp_shexp.weight": (e, 1) if self.shexp_gate_2d else (e,),
            b + "ffn_gate_shexp.weight": (e, fs),
            b + "ffn_up_shexp.weight": (e, fs),
            b + "ffn_down_shexp.weight": (fs, e),
        })
        return shapes

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            shapes.update(self.delta_shapes(i) if i in self.delta_layers
                          else self.attention_shapes(i))
            shapes.update(self.ffn_shapes(i))
        return shapes

    def tensor_types(self) -> dict[str, tuple[str, ...]]:
        """Tensors that only some weight types can hold: the conv taps and the per-head
        vectors are read as f32."""
        out = {}
        for i in self.delta_layers:
            for n in ("ssm_conv1d.weight", "ssm_dt.bias", "ssm_a"):
                out[f"blk.{i}.{n}"] = ("F32",)
        return out

    def expert_tensors(self, layer: int) -> list[str]:
        return config.Experts.expert_tensors(self, layer) if self.moe else []

    def state(self) -> Extra:
        """K and V on the full-attention layers; conv and delta-rule states on the others;
        q's gate beside q; the experts and the shared one (MoE)."""
        return Extra(kv_layers=self.kv_layers, n_expert=self.n_expert,
                     n_expert_used=self.n_expert_used, n_ff_shexp=self.n_ff_shexp, q_gate=True,
                     delta_layers=self.delta_layers, delta_conv_dim=self.conv_channels,
                     delta_width=self.conv_kernel, delta_heads=self.n_v_heads,
                     delta_head_dim=self.ssm_d_state)

    def problems(self) -> list[str]:
        extra = []
        if self.legacy_ssm_in:
            extra.append("delta-net layers with a fused ssm_in (an old qwen3next conversion: "
                         "convert again for attn_qkv and attn_gate)")
        if self.fused_gate_up_exps:
            extra.append("fused ffn_gate_up_exps (separate ffn_gate_exps and ffn_up_exps "
                         "are read)")
        if self.n_layer <= 0:
            extra.append(f"nextn_predict_layers {self.n_layer_nextn} leaves no trunk layers")
        if self.n_v_heads <= 0 or self.n_k_heads <= 0 or self.n_v_heads % self.n_k_heads:
            extra.append(f"ssm.time_step_rank {self.n_v_heads} (value heads) is not a "
                         f"multiple of ssm.group_count {self.n_k_heads} (key heads)")
        elif self.ssm_d_inner % self.n_v_heads or self.head_v_dim != self.ssm_d_state:
            extra.append(f"ssm.inner_size {self.ssm_d_inner} is not ssm.time_step_rank "
                         f"{self.n_v_heads} heads of ssm.state_size {self.ssm_d_state}")
        if not 0 < self.ssm_d_state <= 512:
            extra.append(f"ssm.state_size {self.ssm_d_state}")
        if not 2 <= self.conv_kernel <= 16:
            extra.append(f"ssm.conv_kernel {self.conv_kernel}")
        if self.rope_dims <= 0 or self.rope_dims % 2 or self.rope_dims > self.head_dim:
            extra.append(f"rope.dimension_count {self.rope_dims} (head dim {self.head_dim})")
        if self.arch != "qwen3next" and (len(self.rope_sections) != 4
                                         or not any(self.rope_sections[:3])):
            extra.append(f"rope.dimension_sections {list(self.rope_sections)}")
        elif not all(self.rope_positions()):
            # the GPU forward turns every pair (a NeoX rope), as text positions do where
            # every pair falls in the t, h or w sections
            extra.append(f"rope.dimension_sections {list(self.rope_sections)} leave some "
                         f"rotated pairs unturned (not read)")
        if self.moe:
            extra += config.moe_problems(self)
            if self.n_ff_shexp <= 0 or self.n_ff_shexp % 32:
                extra.append(f"expert_shared_feed_forward_length {self.n_ff_shexp}")
        return extra


def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits;
    the delta-net layers' conv and recurrent states move on by n tokens."""
    heads = DeltaHeads(c.n_v_heads, c.n_k_heads, c.ssm_d_state, tiled=not c.grouped_v_heads)
    blocks.embed(b, c, rs, n)
    for i in range(c.n_layer):
        if i in c.delta_layers:
            delta_net(b, c, rs, i, n, heads)
        else:                                  # Q/K norms, partial NeoX rope, sigmoid gate
            blocks.attention(b, c, rs, i, n, c.rope, neox=True, scale=c.head_dim ** -0.5,
                             qk_norm="head", gated=True)
        if c.moe:
            blocks.moe(b, c, rs, i, n, norm="post_attention_norm", shared=True)
        else:
            blocks.ffn(b, c, rs, i, n, norm="post_attention_norm")
    blocks.head(b, c, rs, n)


def delta_net(b: Builder, c: Config, rs: RunState, i: int, n: int, heads: DeltaHeads) -> None:
    """x += one gated delta-net layer of norm(x), layer i."""
    w, p = b.weights, f"blk.{i}."
    products = [(w[p + "attn_qkv.weight"], rs.dn_qkv),        # [n, conv_channels] q | k | v
                (w[p + "attn_gate.weight"], rs.dn_z)]          # [n, d_inner] z
    if c.arch == "qwen3next":
        products.append((w[p + "ssm_ba.weight"], rs.dn_ba))   # [n, 2 H_v] per k head b | a
        gates = DeltaGates.fused(rs.dn_ba, heads)
    else:
        products += [(w[p + "ssm_beta.weight"], rs.dn_ba),    # [n, H_v]
                     (w[p + "ssm_alpha.weight"], rs.dn_alpha)]  # [n, H_v]
        gates = DeltaGates.separate(rs.dn_ba, rs.dn_alpha, heads)
    b.norm_matmuls(rs.x, w[p + "attn_norm.weight"], c.rms_eps, rs.xn, n, products)
    b.delta_conv(rs.dn_qkv, w[p + "ssm_conv1d.weight"], rs.conv_state[i], rs.dn_conv, n,
                 heads, c.rms_eps)                             # [n, conv_channels]
    b.delta_net(rs.dn_conv, gates, w[p + "ssm_dt.bias"], w[p + "ssm_a"],
                rs.delta_state[i], rs.dn_out, n, heads)        # [n, H_v, d]
    b.norm_gated(rs.dn_out, w[p + "ssm_norm.weight"], rs.dn_z, rs.dn_out, n * c.n_v_heads,
                 c.rms_eps)
    b.matmul(w[p + "ssm_out.weight"], rs.dn_out, rs.x, n, accumulate=True)
