"""Write the vision test data: synthetic mmprojs of the real geometry for Gemma 3 and Qwen3.5,
a synthetic gemma3 text model, two test images, and llama.cpp's (mtmd's) outputs on them.

Run by hand where llama-cpp-python (with libmtmd) and Pillow are installed (CI has neither;
the tests only read what this writes):

    /work/llamacpp-venv/bin/python tests/tools/make_synth_vision.py [--family gemma3|qwen35]

(default: both, Gemma 3 first, since it draws the images; Qwen3.5 reads them and needs
make_synth_models.py's qwen35-f16.gguf).

Gemma 3 (--family gemma3) writes:
  tests/data/synth/gemma3-f16.gguf         gemma3 text model: 2 layers of 256 (both sliding
      window 512, so both see the whole prompt; no rope.freq_base_swa key, as in real Gemma 3
      files, so llama.cpp rotates both with its default 10000, not freq_base 1e6), 4 heads
      (2 KV) of 64, n_ff 512, per-head Q/K norms, post-attention and post-FFN norms, tied
      output, the 400-token vocabulary of make_synth_models.py, F16 matrices. Like
      gemma2-swa-f16 the token embedding (std 0.01, times sqrt(256) on entry) is small beside
      what the layers add and a large output norm brings the logits to std ~4.
  tests/data/synth/gemma3-mmproj-f16.gguf  gemma3 projector, SigLIP of width 64: 2 layers,
      2 heads of 32, n_ff 128, GELU (tanh); 896 px in patches of 14 (4096 patches), pooled
      4x4 to 256 tokens of width 256. Patch and position embeddings F32, layer matrices F16,
      biases and norms F32, mm.input_projection F16 [256, 64] and mm.soft_emb_norm F32
      (stored as 1 + w, around 1). Matrices have std 1/sqrt(fan_in) (Q and K 1.5/sqrt(64),
      so attention over the 4096 patches is selective), position embeddings std 0.1; the
      image embeddings' RMS is that of the token embeddings as layer 0 sees them (0.16).
  tests/data/images/square.png             896 x 896 (mtmd does not resize it)
  tests/data/images/wide.png               640 x 400 (mtmd letterboxes it: bilinear to
      896 x 560 on black at y offset 168)
  tests/data/synth/gemma3-vision.npz       per image IMG in (square, wide):
      IMG_embd [256, 256] float32: mtmd_get_output_embd after mtmd_encode_chunk;
      IMG_ids_before, IMG_ids_after: the text chunks mtmd_tokenize makes before and after the
          image of PROMPT (add_special and parse_special true; they include the
          "<start_of_image>" / "<end_of_image>" text mtmd adds, tokenized on their own);
      IMG_continuation_ids [8]: greedy tokens after the prompt;
      IMG_logits_steps [9, 400] float32: the logits after the prompt and after each
          continuation token;
      and n_image_tokens (256).
  the "gemma3-vision" entry of tests/data/synth/index.json, under "vision_cases" (not
      "cases", whose entries the text-only tests read as make_synth_reference.py's cases):
      file names and sha256 of both GGUFs and both images, the settings, the prompt.

llama.cpp runs on its CPU backend: mtmd with use_gpu false, 2 threads, flash attention off
(clip's attention all F32), no warmup; the llama context n_ctx 2048, n_batch = n_ubatch = 512,
flash attention off, f16 KV cache, 2 threads; the prompt through mtmd_helper_eval_chunks
(n_batch 512, so the image is one non-causal batch), then one llama_decode per greedy token;
the KV cache cleared between images. A second run of "square" on a fresh context must give
the same numbers. The images are read by mtmd's own PNG decoder
(mtmd_helper_bitmap_init_from_file); its pixels are checked against Pillow's.

Printed checks: the resize of wide.png against Pillow's Image.resize (BILINEAR); the relative
Frobenius difference between the two images' embeddings; the largest difference between the
two images' logits after the prompt; and the relative error of llama.cpp's embeddings
against a float64 numpy forward pass of the encoder (plain, and rounding where ggml's CPU
backend rounds to f16).

Qwen3.5 (--family qwen35) reads tests/data/images/*.png and tests/data/synth/qwen35-f16.gguf
(make_synth_models.py's: qwen35 has no deepstack input, so llama_model_n_embd_inp is its
n_embd 128 and an mmproj projecting to 128 fits it) and writes:
  tests/data/synth/qwen35-mmproj-f16.gguf  qwen3vl_merger projector (what Qwen3.5's
      converter writes, no deepstack layers): patch 16 as two F16 kernels (v.patch_embd.weight
      and .weight.1, HF's Conv3d split along its 2 frames; a still image goes through both)
      plus an F32 bias, 2304 F32 position embeddings (48 x 48, std 0.3, resized bilinear with
      aligned corners to the grid), 2 layers of 64, 2 heads of 32 with the 2-D vision rope,
      fused attn_qkv (Q and K 1.5/sqrt(64)), n_ff 128, GELU (tanh), LayerNorms eps 1e-6,
      v.post_ln (HF merger.norm), then each 2 x 2 block of patches (256 wide) through mm.0
      [256, 256], GELU and mm.2 [256 -> 128]. Matrices F16, biases and norms F32; mm.2's scale
      gives soft tokens of RMS ~0.5, that of qwen35-f16's token embeddings.
  tests/data/synth/qwen35-vision.npz       per image IMG in (square, wide), with
      mtmd_context_params.image_max_tokens 256 (qwen3vl_merger reads no mmproj key for it):
      IMG_embd [nx * ny, 128] float32: mtmd_get_output_embd after mtmd_encode_chunk; token i
          at row i // nx, column i % nx of the merged grid;
      IMG_grid [nx, ny]: mtmd_image_tokens_get_nx / _ny; square 16 x 16 (896 px bicubic to
          512), wide 20 x 12 (640 x 400 into 640 x 384: bicubic to 615 x 384 at x offset 12
          on black);
      IMG_n_pos: mtmd_input_chunk_get_n_pos = max(nx, ny), the positions the image takes;
      IMG_positions [n_prompt_tokens, 4] int32: every prompt token's rope positions in
          section order (t, h, w, e) as llama.cpp's graph takes them: text (p, p, p, 0), image
          token i (p0, p0 + i // nx, p0 + i % nx, 0) with p0 the number of tokens before
          (from mtmd_helper_image_get_decoder_pos, ordered as set_position_mrope_2d does),
          the text after from p0 + n_pos;
      IMG_ids_before, IMG_ids_after: the text chunks around the image of Q_PROMPT (they hold
          the "<|vision_start|>" / "<|vision_end|>" text mtmd adds, plain text in this
          400-token vocabulary);
      IMG_continuation_ids [8], IMG_logits_steps [9, 400] float32: as for Gemma 3, the
          continuation decoded at positions n_past + i.
  the "qwen35-vision" entry of index.json's "vision_cases": as Gemma 3's, with the token
      budget (image_max_tokens 256, image_min_tokens 8) and per image its grid, token count
      and n_pos.
The same settings as Gemma 3's, with image_max_tokens 256; mtmd decodes Qwen images causally.
Printed checks besides Gemma 3's: the preprocessed sizes, the bicubic resize against Pillow's
Image.resize (BICUBIC), and the prompt decoded by hand (llama_decode of the text, the soft
tokens at IMG_positions, the text) giving mtmd's logits exactly, and how far they move with
the image at sequential positions instead.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_synth_models as msm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SYNTH = ROOT / "tests" / "data" / "synth"
IMAGES = ROOT / "tests" / "data" / "images"
CASE = "gemma3-vision"
TEXT_FILE = "gemma3-f16.gguf"
MMPROJ_FILE = "gemma3-mmproj-f16.gguf"
IMAGE_NAMES = ("square", "wide")
IMAGE_PATHS = {n: IMAGES / f"{n}.png" for n in IMAGE_NAMES}

N_CONT = 8
N_THREADS = 2
N_CTX = 2048
N_BATCH = 512               # llama context n_batch and n_ubatch, and mtmd_helper_eval_chunks'
MARKER = "<__media__>"      # mtmd's default media marker
PROMPT = ("<start_of_turn>user\n" + MARKER
          + "What is in this picture?<end_of_turn>\n<start_of_turn>model\n")

# the text model
T_HEAD, T_HEAD_KV, T_HEAD_DIM, T_FF, T_CTX, T_WINDOW = 4, 2, 64, 512, 2048, 512
T_EMBD_STD = 0.01           # times sqrt(n_embd) = 16 on entry: RMS 0.16

# the vision tower and projector
IMG_SIZE, PATCH = 896, 14
V_EMBD, V_LAYER, V_HEAD, V_FF, V_EPS = 64, 2, 2, 128, 1e-6
N_PATCH = (IMG_SIZE // PATCH) ** 2          # 4096
N_MERGE = 4                                 # llama.cpp's default pool for gemma3
N_IMG_TOKENS = N_PATCH // N_MERGE ** 2      # 256
IMG_EMBD_RMS = T_EMBD_STD * np.sqrt(msm.N_EMBD)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the model files -----------------------------------------------------------------------------

def make_gemma3(path: Path, vocab: dict) -> None:
    """Gemma 3 text: per-head Q/K RMS norms, post-attention and post-FFN norms, GELU-gated FFN,
    sqrt(n_embd) embedding scale on tokens only, tied output, window 512 on both layers."""
    r, nh, nkv, hd, ff = msm.Rand(path.stem), T_HEAD, T_HEAD_KV, T_HEAD_DIM, T_FF
    w = msm.writer(path, "gemma3", vocab, n_head=nh, n_head_kv=nkv, head_dim=hd, n_ff=ff,
                   ctx=T_CTX, rope_base=1e6)
    w.add_sliding_window(T_WINDOW)
    msm.embeddings(w, r, tied=True, embd_std=T_EMBD_STD, out_norm=25.0)
    for il in range(msm.N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", r.norm(msm.N_EMBD))
        msm.attention(w, r, il, nh, nkv, hd)
        w.add_tensor(p + "attn_q_norm.weight", r.norm(hd))
        w.add_tensor(p + "attn_k_norm.weight", r.norm(hd))
        w.add_tensor(p + "post_attention_norm.weight", r.norm(msm.N_EMBD, 3.0))
        w.add_tensor(p + "ffn_norm.weight", r.norm(msm.N_EMBD))
        msm.dense_ffn(w, r, il, ff)
        w.add_tensor(p + "post_ffw_norm.weight", r.norm(msm.N_EMBD, 3.0))
    msm.finish(w)


def as_f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def clip_writer(path: Path, projector: str, *, image_size: int, patch: int, n_embd: int,
                n_ff: int, n_layer: int, n_out: int, n_head: int, eps: float):
    """A GGUFWriter for an mmproj with the keys clip.cpp reads of every vision tower here: the
    projector type, a vision encoder with GELU (tanh), its geometry, projection_dim n_out (the
    text model's width), image mean and std 0.5."""
    import gguf

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_name(f"synthetic {path.stem}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_string("clip.projector_type", projector)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch)
    w.add_uint32("clip.vision.embedding_length", n_embd)
    w.add_uint32("clip.vision.feed_forward_length", n_ff)
    w.add_uint32("clip.vision.block_count", n_layer)
    w.add_uint32("clip.vision.projection_dim", n_out)
    w.add_uint32("clip.vision.attention.head_count", n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", eps)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    return w


def add_encoder_layers(w, r: msm.Rand, n_layer: int, D: int, F: int, add_qkv) -> None:
    """The tower's layers and v.post_ln: LayerNorms (weight ~1, bias std 0.1), attention
    (add_qkv(prefix) adds the family's Q, K and V tensors) with attn_out, and the FFN, matrices
    std 1/sqrt(fan_in)."""
    for il in range(n_layer):
        b = f"v.blk.{il}."
        w.add_tensor(b + "ln1.weight", r.norm(D))
        w.add_tensor(b + "ln1.bias", r.vec(D, 0.1))
        add_qkv(b)
        w.add_tensor(b + "attn_out.weight", r.mat(D, D))
        w.add_tensor(b + "attn_out.bias", r.vec(D, 0.1))
        w.add_tensor(b + "ln2.weight", r.norm(D))
        w.add_tensor(b + "ln2.bias", r.vec(D, 0.1))
        w.add_tensor(b + "ffn_up.weight", r.mat(F, D))              # ne [D, F]: HF fc1
        w.add_tensor(b + "ffn_up.bias", r.vec(F, 0.1))
        w.add_tensor(b + "ffn_down.weight", r.mat(D, F))            # ne [F, D]: HF fc2
        w.add_tensor(b + "ffn_down.bias", r.vec(D, 0.1))
    w.add_tensor("v.post_ln.weight", r.norm(D))                     # Qwen's HF merger.norm
    w.add_tensor("v.post_ln.bias", r.vec(D, 0.1))


def make_mmproj(path: Path) -> None:
    """The gemma3 mmproj: the keys clip.cpp reads, the tensors of the SigLIP tower and the
    gemma3 projector (numpy shapes are torch's: a Linear weight is (out, in))."""
    r, D = msm.Rand(path.stem), V_EMBD
    rng = r.rng
    w = clip_writer(path, "gemma3", image_size=IMG_SIZE, patch=PATCH, n_embd=D, n_ff=V_FF,
                    n_layer=V_LAYER, n_out=msm.N_EMBD, n_head=V_HEAD, eps=V_EPS)

    fan = 3 * PATCH * PATCH
    w.add_tensor("v.patch_embd.weight",                              # ne [14, 14, 3, D]
                 as_f32(rng.standard_normal((D, 3, PATCH, PATCH)) / np.sqrt(fan)))
    w.add_tensor("v.patch_embd.bias", r.vec(D, 0.1))
    w.add_tensor("v.position_embd.weight", as_f32(0.1 * rng.standard_normal((N_PATCH, D))))

    def add_qkv(b: str) -> None:
        for n, scale in (("attn_q", 1.5), ("attn_k", 1.5), ("attn_v", 1.0)):
            w.add_tensor(b + n + ".weight", r.mat(D, D, scale=scale))
            w.add_tensor(b + n + ".bias", r.vec(D, 0.1))

    add_encoder_layers(w, r, V_LAYER, D, V_FF, add_qkv)
    # HF mm_input_projection_weight (D, n_text), used as x @ W: ne [n_text, D]. The RMS-normed
    # rows (RMS ~1) come out with RMS IMG_EMBD_RMS.
    proj = rng.standard_normal((D, msm.N_EMBD), dtype=np.float32) * (IMG_EMBD_RMS / np.sqrt(D))
    w.add_tensor("mm.input_projection.weight", proj.astype(np.float16))
    w.add_tensor("mm.soft_emb_norm.weight", r.norm(D))               # stored as 1 + w
    msm.finish(w)


# -- the images ----------------------------------------------------------------------------------

def draw_square() -> np.ndarray:
    """896 x 896: red across, green down, a red rectangle, a white disc, a black square, a
    band of blue/yellow stripes 8 px high."""
    H = W = IMG_SIZE
    y, x = np.mgrid[0:H, 0:W]
    img = np.stack([x * 255 // (W - 1), y * 255 // (H - 1), np.full((H, W), 96)], axis=-1)
    img[520:820, 80:360] = (240, 30, 60)
    img[(x - 600) ** 2 + (y - 330) ** 2 <= 190 ** 2] = (250, 250, 250)
    img[600:780, 520:700] = (10, 10, 10)
    band = (y >= 40) & (y < 120)
    img[band & ((y // 8) % 2 == 0)] = (0, 0, 255)
    img[band & ((y // 8) % 2 == 1)] = (255, 255, 0)
    return img.astype(np.uint8)


def draw_wide() -> np.ndarray:
    """640 x 400: red falling down, green across, blue along the diagonal, a blue rectangle,
    a yellow disc, black/white vertical stripes 6 px wide (the resize blends them)."""
    H, W = 400, 640
    y, x = np.mgrid[0:H, 0:W]
    img = np.stack([200 - y * 150 // (H - 1), x * 255 // (W - 1),
                    (x + y) * 255 // (W + H - 2)], axis=-1)
    img[60:200, 40:250] = (20, 60, 230)
    img[(x - 450) ** 2 + (y - 250) ** 2 <= 110 ** 2] = (255, 220, 0)
    stripes = (x >= 300) & (x < 380) & (y >= 20) & (y < 380)
    img[stripes] = np.where(((x[stripes] // 6) % 2 == 0)[:, None], 0, 255)
    return img.astype(np.uint8)


def write_images(folder: Path) -> dict[str, np.ndarray]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    out = {"square": draw_square(), "wide": draw_wide()}
    for name, img in out.items():
        Image.fromarray(img, "RGB").save(folder / f"{name}.png", optimize=True)
        back = np.asarray(Image.open(folder / f"{name}.png").convert("RGB"))
        assert np.array_equal(back, img), f"{name}.png does not read back"
    return out


# -- llama.cpp -----------------------------------------------------------------------------------

class Mtmd:
    """The text model, an mtmd context on the mmproj, and llama contexts on demand; llama.cpp
    and mtmd log nothing while it lives."""

    def __init__(self, text_path: Path, mmproj_path: Path, image_max_tokens: int = -1):
        import llama_cpp as L
        from llama_cpp import mtmd_cpp as M

        self.L, self.M = L, M
        self.quiet = quiet_llama_cpp()          # kept alive while llama.cpp runs
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(str(text_path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {text_path}")
        self.n_embd = L.llama_model_n_embd(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        p = M.mtmd_context_params_default()
        p.use_gpu = False
        p.n_threads = N_THREADS
        p.print_timings = False
        p.flash_attn_type = 0                   # disabled: clip's attention all F32
        p.warmup = False
        if image_max_tokens > 0:                # clip's token budget (qwen3vl reads no key)
            p.image_max_tokens = image_max_tokens
        self.params = {"use_gpu": False, "n_threads": N_THREADS, "flash_attn_type": 0,
                       "warmup": False, "media_marker": p.media_marker.decode(),
                       "image_min_tokens": p.image_min_tokens,
                       "image_max_tokens": p.image_max_tokens}
        self.mctx = M.mtmd_init_from_file(str(mmproj_path).encode(), self.model, p)
        if not self.mctx:
            raise RuntimeError(f"mtmd cannot load {mmproj_path}")
        assert M.mtmd_support_vision(self.mctx)
        assert M.mtmd_get_marker(self.mctx).decode() == MARKER

    def new_context(self):
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = N_CTX, N_BATCH, N_BATCH
        cp.n_threads = cp.n_threads_batch = N_THREADS
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        lctx = L.llama_init_from_model(self.model, cp)
        if not lctx:
            raise RuntimeError("llama.cpp cannot make a context")
        return lctx

    def logits(self, lctx) -> np.ndarray:
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(lctx, -1),
                                     shape=(self.n_vocab,)).copy()

    def decode_token(self, lctx, token: int, pos: int) -> None:
        L = self.L
        b = L.llama_batch_init(1, 0, 1)
        try:
            b.n_tokens = 1
            b.token[0], b.pos[0], b.n_seq_id[0], b.logits[0] = token, pos, 1, 1
            b.seq_id[0][0] = 0
            rc = L.llama_decode(lctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        finally:
            L.llama_batch_free(b)

    def decode_batch(self, lctx, pos: np.ndarray, tokens=None, embd=None,
                     logits_last: bool = False) -> None:
        """One llama_decode of tokens [n] or embeddings [n, n_embd], sequence 0; pos [n] for
        tokens, [n, 4] (M-RoPE sections t, h, w, e) for embeddings, passed section-major as
        llama_batch wants them."""
        L = self.L
        n = len(tokens) if tokens is not None else len(embd)
        keep = {"pos": np.ascontiguousarray(np.asarray(pos, np.int32).T.reshape(-1)),
                "n_seq_id": np.ones(n, np.int32), "seq": np.zeros(1, np.int32),
                "logits": np.zeros(n, np.int8)}
        keep["logits"][-1] = logits_last
        seq_ptr = keep["seq"].ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        keep["seq_ids"] = (ctypes.POINTER(ctypes.c_int32) * n)(*([seq_ptr] * n))
        b = L.llama_batch()
        b.n_tokens = n
        b.pos = keep["pos"].ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        b.n_seq_id = keep["n_seq_id"].ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        b.seq_id = keep["seq_ids"]
        b.logits = keep["logits"].ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        if tokens is not None:
            keep["tokens"] = np.ascontiguousarray(tokens, np.int32)
            b.token = keep["tokens"].ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        else:
            keep["embd"] = np.ascontiguousarray(embd, np.float32)
            b.embd = keep["embd"].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        rc = L.llama_decode(lctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def run(self, lctx, image_path: Path, pixels: np.ndarray,
            prompt: str = PROMPT) -> tuple[dict, dict]:
        """Tokenize prompt with the image, encode it, evaluate the prompt, N_CONT greedy steps.
        Returns the numbers kept and what mtmd said of the image chunk: n_tokens, n_pos, the
        token grid (nx, ny), whether it decodes non-causally, and with M-RoPE the 4 positions
        of each image token in rope-section order (t, h, w, e), as
        mtmd_helper_decode_image_chunk gives them to llama.cpp."""
        L, M = self.L, self.M
        L.llama_memory_clear(L.llama_get_memory(lctx), True)
        bmp = M.mtmd_helper_bitmap_init_from_file(self.mctx, str(image_path).encode(), False)
        if not bmp:
            raise RuntimeError(f"mtmd cannot read {image_path}")
        chunks = M.mtmd_input_chunks_init()
        try:
            nx, ny = M.mtmd_bitmap_get_nx(bmp), M.mtmd_bitmap_get_ny(bmp)
            got = np.ctypeslib.as_array(M.mtmd_bitmap_get_data(bmp), shape=(ny, nx, 3))
            assert np.array_equal(got, pixels), f"{image_path.name}: stb and Pillow disagree"
            text = M.mtmd_input_text()
            raw = prompt.encode()
            text.text, text.text_len = raw, len(raw)
            text.add_special = text.parse_special = True
            rc = M.mtmd_tokenize(self.mctx, chunks, ctypes.byref(text),
                                 (M.mtmd_bitmap_p_ctypes * 1)(bmp), 1)
            if rc != 0:
                raise RuntimeError(f"mtmd_tokenize returned {rc}")
            kinds, texts, image = [], [], None
            for i in range(M.mtmd_input_chunks_size(chunks)):
                c = M.mtmd_input_chunks_get(chunks, i)
                kind = M.mtmd_input_chunk_get_type(c)
                kinds.append(kind)
                if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    p = M.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                    texts.append([int(p[j]) for j in range(n.value)])
                else:
                    image = c
            assert kinds == [M.MTMD_INPUT_CHUNK_TYPE_TEXT, M.MTMD_INPUT_CHUNK_TYPE_IMAGE,
                             M.MTMD_INPUT_CHUNK_TYPE_TEXT], kinds
            n_img = M.mtmd_input_chunk_get_n_tokens(image)
            toks = M.mtmd_input_chunk_get_tokens_image(image)
            info = {"n_tokens": n_img, "n_pos": M.mtmd_input_chunk_get_n_pos(image),
                    "grid": (M.mtmd_image_tokens_get_nx(toks), M.mtmd_image_tokens_get_ny(toks)),
                    "non_causal": bool(M.mtmd_decode_use_non_causal(self.mctx, image))}
            if M.mtmd_decode_use_mrope(self.mctx):
                # mtmd_helper_decode_image_chunk: the decoder positions from pos_0 = the
                # tokens before, then set_position_mrope_2d's order: t, y (row), x (column), z
                dp = (M.mtmd_decoder_pos * n_img)()
                M.mtmd_helper_image_get_decoder_pos(toks, len(texts[0]), dp)
                info["image_pos"] = np.array([(d.t, d.y, d.x, d.z) for d in dp], np.int32)
            if M.mtmd_encode_chunk(self.mctx, image) != 0:
                raise RuntimeError("mtmd_encode_chunk failed")
            embd = np.ctypeslib.as_array(M.mtmd_get_output_embd(self.mctx),
                                         shape=(n_img * self.n_embd,))
            embd = embd.reshape(n_img, self.n_embd).copy()
            n_past = L.llama_pos(0)
            rc = M.mtmd_helper_eval_chunks(self.mctx, lctx, chunks, 0, 0, N_BATCH, True,
                                           ctypes.byref(n_past))
            if rc != 0:
                raise RuntimeError(f"mtmd_helper_eval_chunks returned {rc}")
            n_prompt = len(texts[0]) + info["n_pos"] + len(texts[1])   # positions, not tokens
            assert n_past.value == n_prompt, (n_past.value, n_prompt)
            steps, cont = [self.logits(lctx)], []
            for i in range(N_CONT):
                cont.append(int(np.argmax(steps[-1])))
                self.decode_token(lctx, cont[-1], n_prompt + i)
                steps.append(self.logits(lctx))
        finally:
            M.mtmd_input_chunks_free(chunks)
            M.mtmd_bitmap_free(bmp)
        logits = np.stack(steps).astype(np.float32)
        assert np.isfinite(logits).all() and np.isfinite(embd).all()
        return ({"embd": embd.astype(np.float32), "ids_before": np.array(texts[0], np.int32),
                 "ids_after": np.array(texts[1], np.int32),
                 "continuation_ids": np.array(cont, np.int32), "logits_steps": logits}, info)

    def close(self) -> None:
        self.M.mtmd_free(self.mctx)
        self.L.llama_model_free(self.model)


# -- a float64 reference of the encoder ---------------------------------------------------------

def _pillow_filter(algo: str):
    """resize_pillow's filters: (support, weight(x)); Pillow's bicubic (a = -0.5)."""
    if algo == "bilinear":
        return 1.0, lambda x: 1.0 - abs(x) if abs(x) < 1.0 else 0.0

    def cubic(x: float) -> float:
        a, x = -0.5, abs(x)
        if x < 1.0:
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
        if x < 2.0:
            return (((x - 5) * x + 8) * x - 4) * a
        return 0.0

    if algo == "bicubic":
        return 2.0, cubic
    raise ValueError(algo)


def pillow_weights(n_in: int, n_out: int, algo: str = "bilinear") -> np.ndarray:
    """resize_pillow's precompute_weights as a dense [n_out, n_in] matrix of 22-bit fixed-point
    weights: the filter widened by the scale when downsampling (antialiased), centers at
    (xx + 0.5) * scale, weights normalized then rounded half away from zero."""
    support, filt = _pillow_filter(algo)
    scale = filterscale = n_in / n_out
    if filterscale < 1.0:
        filterscale = 1.0
    support *= filterscale
    ss = 1.0 / filterscale
    m = np.zeros((n_out, n_in), np.int64)
    for xx in range(n_out):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)            # C cast truncates toward zero
        xmax = min(int(center + support + 0.5), n_in) - xmin
        ws, ww = [], 0.0
        for x in range(xmax):
            w = filt((x + xmin - center + 0.5) * ss)
            ws.append(w)
            ww += w                                           # sequential, as in C
        for x in range(xmax):
            w = ws[x] / ww if ww != 0.0 else ws[x]
            m[xx, xmin + x] = int(w * 4194304.0 + (-0.5 if w < 0 else 0.5))   # 2^22, trunc
    return m


def _resample_axis(a: np.ndarray, n_out: int, axis: int, algo: str) -> np.ndarray:
    """One pass over axis (1: horizontal, 0: vertical) of an (H, W, 3) u8 image, u8 out."""
    m = pillow_weights(a.shape[axis], n_out, algo)
    a = a.astype(np.int64)
    acc = (np.einsum("ox,yxc->yoc", m, a) if axis == 1 else np.einsum("oy,yxc->oxc", m, a))
    return np.clip((acc + (1 << 21)) >> 22, 0, 255).astype(np.uint8)   # >> floors, as in C


def resize_u8(img: np.ndarray, nw: int, nh: int, algo: str = "bilinear") -> np.ndarray:
    """resize_pillow: horizontal pass, then vertical, u8 between them."""
    if nw != img.shape[1]:
        img = _resample_axis(img, nw, 1, algo)
    if nh != img.shape[0]:
        img = _resample_axis(img, nh, 0, algo)
    return img


def letterbox_size(w0: int, h0: int, size: int) -> tuple[int, int, int, int]:
    """(new_w, new_h, offset_x, offset_y) of img_tool::resize with PAD_CEIL."""
    scale = min(np.float32(size) / np.float32(w0), np.float32(size) / np.float32(h0))
    nw = min(int(np.ceil(np.float32(w0) * scale)), size)     # int * float in float32, as in C
    nh = min(int(np.ceil(np.float32(h0) * scale)), size)
    return nw, nh, (size - nw) // 2, (size - nh) // 2


def letterbox(img: np.ndarray, size: int) -> np.ndarray:
    """img_tool::resize(..., BILINEAR, PAD_CEIL, black): aspect-preserving resize to fit
    size x size, centered (integer division) on a black canvas; unchanged if already square
    of that size."""
    h0, w0 = img.shape[:2]
    if (h0, w0) == (size, size):
        return img.copy()
    nw, nh, ox, oy = letterbox_size(w0, h0, size)
    canvas = np.zeros((size, size, 3), np.uint8)
    canvas[oy:oy + nh, ox:ox + nw] = resize_u8(img, nw, nh)
    return canvas


def read_mmproj(path: str, projector: str):
    """(kv(name, default) for the metadata, the hparams both towers read, tensors as float64 in
    numpy (torch) order, tensor name -> ggml type name) of an mmproj of that projector type."""
    import gguf

    r = gguf.GGUFReader(path)

    def kv(name, default=None):
        f = r.fields.get(name)
        if f is None:
            return default
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            return [f.parts[i].tolist()[0] for i in f.data]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode()
        return f.parts[f.data[0]].tolist()[0]

    proj = kv("clip.projector_type", kv("clip.vision.projector_type"))
    if proj != projector:
        raise ValueError(f"{path}: projector {proj!r}, not {projector}")
    D = kv("clip.vision.embedding_length")
    n_head = kv("clip.vision.attention.head_count")
    hp = {
        "n_embd": D, "n_head": n_head,
        "head_dim": kv("clip.vision.attention.head_dim", D // n_head),
        "n_layer": kv("clip.vision.block_count"),
        "eps": kv("clip.vision.attention.layer_norm_epsilon"),
        "patch_size": kv("clip.vision.patch_size"),
        "mean": kv("clip.vision.image_mean"), "std": kv("clip.vision.image_std"),
        # clip.cpp: use_gelu -> GELU (tanh), use_silu -> SiLU, neither -> GELU_QUICK
        "act": "gelu" if kv("clip.use_gelu", False) else
               "silu" if kv("clip.use_silu", False) else "gelu_quick",
    }
    T, types = {}, {}
    for t in r.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))       # ne reversed = numpy order
        a = gguf.quants.dequantize(np.array(t.data), t.tensor_type)
        T[t.name] = np.asarray(a, np.float64).reshape(shape)
        types[t.name] = t.tensor_type.name
    return kv, hp, T, types


def load_mmproj(path: str) -> tuple[dict, dict[str, np.ndarray], dict[str, str]]:
    """(hparams, tensors as float64 in numpy (torch) order, tensor name -> ggml type name)."""
    kv, hp, T, types = read_mmproj(path, "gemma3")
    hp["image_size"] = kv("clip.vision.image_size")
    hp["n_merge"] = kv("clip.vision.projector.scale_factor", 4)
    # legacy conversions named fc1 ffn_down: llama.cpp swaps by shape (clip.cpp)
    for il in range(hp["n_layer"]):
        b = f"v.blk.{il}."
        if T[b + "ffn_down.weight"].shape[-1] == hp["n_embd"]:  # ne[0] == n_embd: it is fc1
            for s in ("weight", "bias"):
                T[b + "ffn_up." + s], T[b + "ffn_down." + s] = \
                    T[b + "ffn_down." + s], T[b + "ffn_up." + s]
                types[b + "ffn_up." + s], types[b + "ffn_down." + s] = \
                    types[b + "ffn_down." + s], types[b + "ffn_up." + s]
    return hp, T, types


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float64)


def _bf16(a: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16: round to nearest even on the top 16 bits (no NaNs here)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def _as_ggml_rounds(x: np.ndarray, wtype: str) -> np.ndarray:
    """The activations as ggml's CPU mul_mat sees them beside a weight of type wtype
    (its vec_dot_type): f16 for F16, bf16 for BF16, unchanged for F32. Quantized weights
    take 8-bit blocks, not emulated here."""
    return _f16(x) if wtype == "F16" else _bf16(x) if wtype == "BF16" else x


def _gelu_tanh(a: np.ndarray) -> np.ndarray:
    return 0.5 * a * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (a + 0.044715 * a ** 3)))


def _activation(a: np.ndarray, kind: str, ggml_rounding: bool) -> np.ndarray:
    """The FFN activation hp["act"] names; with ggml_rounding, GELU as ggml's CPU backend
    computes it."""
    if kind == "gelu":
        if not ggml_rounding:
            return _gelu_tanh(a)
        # ggml CPU: f16 table of GELU at f16(x) for -10 < x < 10, 0 below, x above
        g = _f16(_gelu_tanh(_f16(a)))
        return np.where(a <= -10.0, 0.0, np.where(a >= 10.0, a, g))
    if kind == "silu":
        return a / (1.0 + np.exp(-a))
    return a / (1.0 + np.exp(-1.702 * a))


def _layer_norm(a: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    m = a.mean(-1, keepdims=True)
    v = ((a - m) ** 2).mean(-1, keepdims=True)
    return (a - m) / np.sqrt(v + eps) * w + b


def _linear(T: dict, types: dict, ggml_rounding: bool):
    """mm(x, name): x @ W.T for the Linear weight of that name (numpy (out, in)), x rounded as
    ggml's CPU mul_mat rounds it beside W's type when ggml_rounding."""
    def mm(x, name):
        if ggml_rounding:
            x = _as_ggml_rounds(x, types[name])
        return x @ T[name].T
    return mm


def _patch_embd(px: np.ndarray, hp: dict, T: dict, types: dict, kernels: tuple[str, ...],
                ggml_rounding: bool) -> np.ndarray:
    """clip's patch embedding of the preprocessed (H, W, 3) u8 image, [n_patch, D] float64:
    the patches (raster order) through each of kernels, summed, plus v.patch_embd.bias where
    there is one. ggml_rounding: im2col's f16 pixels and kernels (unless BF16)."""
    P, D = hp["patch_size"], hp["n_embd"]
    gh, gw = px.shape[0] // P, px.shape[1] // P
    # clip_image_f32::from_u8 (v / 255.0f), normalize ((v - mean) / std), all float32 in C
    x = px.astype(np.float32) / np.float32(255.0)
    mean = np.asarray(hp["mean"], np.float32)
    std = np.asarray(hp["std"], np.float32)
    x = ((x - mean) / std).astype(np.float64).transpose(2, 0, 1)          # planar CHW
    # conv2d as im2col + mul_mat: patch p = py * gw + px, column c * P * P + kh * P + kw
    cols = x.reshape(3, gh, P, gw, P).transpose(1, 3, 0, 2, 4).reshape(gh * gw, 3 * P * P)
    kerns = [T[k].reshape(D, 3 * P * P) for k in kernels]
    if ggml_rounding and types[kernels[0]] != "BF16":              # im2col is f16 then
        cols, kerns = _f16(cols), [_f16(k) for k in kerns]
    h = cols @ kerns[0].T
    for k in kerns[1:]:
        h = h + cols @ k.T
    if "v.patch_embd.bias" in T:
        h = h + T["v.patch_embd.bias"]
    return h


def _encoder_layers(h: np.ndarray, hp: dict, T: dict, mm, act, qkv) -> np.ndarray:
    """The tower's layers on h [n, D], then v.post_ln: qkv(t, prefix) gives the family's Q, K
    and V of the normed t, [n, n_head, head_dim] each; attention has no mask (every patch
    sees every patch)."""
    n, nh, dh, eps = h.shape[0], hp["n_head"], hp["head_dim"], hp["eps"]
    for il in range(hp["n_layer"]):
        b = f"v.blk.{il}."
        t = _layer_norm(h, T[b + "ln1.weight"], T[b + "ln1.bias"], eps)
        q, k, v = qkv(t, b)
        o = np.empty_like(q)
        for hh in range(nh):
            a = (q[:, hh] @ k[:, hh].T) / np.sqrt(dh)
            a = np.exp(a - a.max(-1, keepdims=True))
            o[:, hh] = (a / a.sum(-1, keepdims=True)) @ v[:, hh]
        h = h + mm(o.reshape(n, nh * dh), b + "attn_out.weight") + T[b + "attn_out.bias"]
        t = _layer_norm(h, T[b + "ln2.weight"], T[b + "ln2.bias"], eps)
        t = act(mm(t, b + "ffn_up.weight") + T[b + "ffn_up.bias"])
        h = h + mm(t, b + "ffn_down.weight") + T[b + "ffn_down.bias"]
    return _layer_norm(h, T["v.post_ln.weight"], T["v.post_ln.bias"], eps)


def encode(image_rgb_u8: np.ndarray, mmproj_path: str, *, ggml_rounding: bool = False,
           return_pixels: bool = False):
    """The image embeddings mtmd_get_output_embd returns for this image: [n_tokens, n_text]
    (256 x n_embd_text for Gemma 3), token t = oy * 16 + ox of the pooled grid, float64.
    ggml_rounding: round to f16 where ggml's CPU backend does (im2col pixels and kernel, the
    activations entering F16 matrices, GELU's f16 table). return_pixels: also return the
    preprocessed (size, size, 3) u8 image."""
    hp, T, types = load_mmproj(mmproj_path)
    img = np.ascontiguousarray(image_rgb_u8, dtype=np.uint8)
    assert img.ndim == 3 and img.shape[2] == 3, "expected (H, W, 3) RGB u8"
    S, P, D, eps = hp["image_size"], hp["patch_size"], hp["n_embd"], hp["eps"]
    nh, dh = hp["n_head"], hp["head_dim"]
    px = letterbox(img, S)
    mm = _linear(T, types, ggml_rounding)
    h = _patch_embd(px, hp, T, types, ("v.patch_embd.weight",), ggml_rounding)
    h = h + T["v.position_embd.weight"]                                    # [n_patch, D]

    def qkv(t, b):
        return [(mm(t, b + n + ".weight") + T[b + n + ".bias"]).reshape(len(t), nh, dh)
                for n in ("attn_q", "attn_k", "attn_v")]

    h = _encoder_layers(h, hp, T, mm, lambda a: _activation(a, hp["act"], ggml_rounding), qkv)

    # gemma3 projector: n_merge x n_merge average pool of the G x G grid (rows = y),
    # RMS norm times the stored soft_emb_norm (already 1 + w), then x @ input_projection
    G, k4 = S // P, hp["n_merge"]
    g = G // k4
    t = h.reshape(G, G, D).reshape(g, k4, g, k4, D).mean(axis=(1, 3)).reshape(g * g, D)
    t = t / np.sqrt((t ** 2).mean(-1, keepdims=True) + eps) * T["mm.soft_emb_norm.weight"]
    W = T["mm.input_projection.weight"]                      # numpy (D, n_text)
    if ggml_rounding:                # the graph's cont(transpose(W)) keeps W's type
        t = _as_ggml_rounds(t, types["mm.input_projection.weight"])
    out = t @ W
    return (out, px) if return_pixels else out


# -- Qwen3.5 ---------------------------------------------------------------------------------------
# Qwen3.5's mmproj is clip's "qwen3vl_merger" (convert_hf_to_gguf's Qwen3VLVisionModel, with no
# deepstack layers). Its text model is make_synth_models.py's qwen35-f16, read, not rewritten:
# qwen35 has no deepstack input, so llama_model_n_embd_inp is n_embd (128) and an mmproj
# projecting to 128 passes mtmd's width check.

Q_CASE = "qwen35-vision"
Q_TEXT_FILE = "qwen35-f16.gguf"
Q_MMPROJ_FILE = "qwen35-mmproj-f16.gguf"
Q_PROMPT = ("<|im_start|>user\n" + MARKER
            + "What is in this picture?<|im_end|>\n<|im_start|>assistant\n")
Q_PATCH, Q_MERGE = 16, 2                    # Qwen3.5's patch and spatial merge
Q_POS_SIDE = 48                             # Qwen3.5's 2304 position embeddings, 48 x 48
Q_EMBD, Q_LAYER, Q_HEAD, Q_FF, Q_EPS = 64, 2, 2, 128, 1e-6
Q_MAX_TOKENS = 256      # mtmd_context_params.image_max_tokens (llama.cpp's default is 4096)
Q_MIN_TOKENS = 8        # llama.cpp's qwen default, left as it is
Q_TEXT_EMBD_RMS = 0.5   # qwen35-f16's token embeddings (std 0.5)
Q_FC2_SCALE = 0.7       # soft tokens of RMS ~0.5, as the token embeddings (printed)


def make_qwen35_mmproj(path: Path) -> None:
    """The qwen3vl_merger mmproj: the keys clip.cpp reads (and the converter's
    spatial_merge_size and is_deepstack_layers), the two temporal halves of the patch
    kernel, fused QKV, and the merger (post_ln, mm.0, mm.2). numpy shapes are torch's."""
    r, D = msm.Rand(path.stem), Q_EMBD
    rng = r.rng
    w = clip_writer(path, "qwen3vl_merger", image_size=Q_POS_SIDE * Q_PATCH,   # 768, unused by clip
                    patch=Q_PATCH, n_embd=D, n_ff=Q_FF, n_layer=Q_LAYER, n_out=msm.HYB_EMBD,
                    n_head=Q_HEAD, eps=Q_EPS)
    w.add_uint32("clip.vision.spatial_merge_size", Q_MERGE)
    w.add_array("clip.vision.is_deepstack_layers", [False] * Q_LAYER)

    fan = 3 * Q_PATCH * Q_PATCH                 # per temporal half; their sum has std ~1.4x
    for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):     # ne [16, 16, 3, D]
        k = rng.standard_normal((D, 3, Q_PATCH, Q_PATCH), dtype=np.float32) / np.sqrt(fan)
        w.add_tensor(name, k.astype(np.float16))
    w.add_tensor("v.patch_embd.bias", r.vec(D, 0.1))
    w.add_tensor("v.position_embd.weight",
                 as_f32(0.3 * rng.standard_normal((Q_POS_SIDE * Q_POS_SIDE, D))))

    def add_qkv(b: str) -> None:
        # HF attn.qkv (3D, D): rows Q, K, V, each head's d_head rows together
        qkv = np.concatenate([r.mat(D, D, scale=1.5), r.mat(D, D, scale=1.5), r.mat(D, D)])
        w.add_tensor(b + "attn_qkv.weight", qkv)
        w.add_tensor(b + "attn_qkv.bias", r.vec(3 * D, 0.1))

    add_encoder_layers(w, r, Q_LAYER, D, Q_FF, add_qkv)
    w.add_tensor("mm.0.weight", r.mat(4 * D, 4 * D))                # HF merger.linear_fc1
    w.add_tensor("mm.0.bias", r.vec(4 * D, 0.1))
    w.add_tensor("mm.2.weight", r.mat(msm.HYB_EMBD, 4 * D, scale=Q_FC2_SCALE))   # linear_fc2
    w.add_tensor("mm.2.bias", r.vec(msm.HYB_EMBD, 0.05))
    msm.finish(w)


def qwen35_target_size(w: int, h: int, *, patch: int = Q_PATCH, merge: int = Q_MERGE,
                       min_tokens: int = Q_MIN_TOKENS,
                       max_tokens: int = Q_MAX_TOKENS) -> tuple[int, int]:
    """img_tool::calc_size_preserved_ratio (mtmd-image.cpp), float32 as in C: each side rounded
    to a multiple of patch * merge (std::round: half away from zero); over max_tokens, both
    sides / beta = sqrt(h * w / max_pixels) floored to multiples; under min_tokens, * beta
    ceiled."""
    f32, a = np.float32, patch * merge
    fa = f32(a)
    min_px, max_px = min_tokens * a * a, max_tokens * a * a
    w_bar = max(a, int(np.floor(f32(w) / fa + f32(0.5))) * a)
    h_bar = max(a, int(np.floor(f32(h) / fa + f32(0.5))) * a)
    if h_bar * w_bar > max_px:
        beta = np.sqrt(f32(f32(h) * f32(w)) / f32(max_px), dtype=np.float32)
        h_bar = max(a, int(np.floor(f32(h) / beta / fa)) * a)
        w_bar = max(a, int(np.floor(f32(w) / beta / fa)) * a)
    elif h_bar * w_bar < min_px:
        beta = np.sqrt(f32(min_px) / f32(f32(h) * f32(w)), dtype=np.float32)
        h_bar = int(np.ceil(f32(h) * beta / fa)) * a
        w_bar = int(np.ceil(f32(w) * beta / fa)) * a
    return w_bar, h_bar


def fit_size(w0: int, h0: int, tw: int, th: int) -> tuple[int, int, int, int]:
    """img_tool::resize's PAD_CEIL letterbox into tw x th: (new_w, new_h, offset_x, offset_y)."""
    f32 = np.float32
    scale = min(f32(tw) / f32(w0), f32(th) / f32(h0))
    nw = min(int(np.ceil(f32(w0) * scale)), tw)
    nh = min(int(np.ceil(f32(h0) * scale)), th)
    return nw, nh, (tw - nw) // 2, (th - nh) // 2


def qwen35_preprocess(img: np.ndarray, **limits) -> np.ndarray:
    """mtmd_image_preprocessor_dyn_size: the target size above, then (unless it is the image's
    own size) Pillow-style bicubic resize that keeps the aspect, pasted centered on black."""
    h0, w0 = img.shape[:2]
    tw, th = qwen35_target_size(w0, h0, **limits)
    if (tw, th) == (w0, h0):
        return img.copy()
    nw, nh, ox, oy = fit_size(w0, h0, tw, th)
    canvas = np.zeros((th, tw, 3), np.uint8)
    canvas[oy:oy + nh, ox:ox + nw] = resize_u8(img, nw, nh, "bicubic")
    return canvas


def load_qwen35_mmproj(path: str) -> tuple[dict, dict[str, np.ndarray], dict[str, str]]:
    kv, hp, T, types = read_mmproj(path, "qwen3vl_merger")
    hp["n_merge"] = kv("clip.vision.spatial_merge_size", 2)
    return hp, T, types


def interp_align_corners(pe: np.ndarray, gw: int, gh: int) -> np.ndarray:
    """clip_graph::resize_position_embeddings(BILINEAR | ALIGN_CORNERS): the [n * n, D] table
    (row r at x = r % n, y = r // n) resampled to gh x gw, [gh * gw, D] in raster order; as
    it is when the grid is n x n."""
    n = int(round(np.sqrt(pe.shape[0])))
    if (gw, gh) == (n, n):
        return pe.copy()
    grid = pe.reshape(n, n, -1)

    def axis(n_out):
        src = np.arange(n_out) * (n - 1) / (n_out - 1) if n_out > 1 else np.zeros(1)
        i0 = np.clip(np.floor(src).astype(np.int64), 0, n - 1)
        return i0, np.clip(i0 + 1, 0, n - 1), np.clip(src - i0, 0.0, 1.0)

    y0, y1, dy = axis(gh)
    x0, x1, dx = axis(gw)
    dy, dx = dy[:, None, None], dx[None, :, None]
    out = (grid[y0][:, x0] * (1 - dx) * (1 - dy) + grid[y0][:, x1] * dx * (1 - dy)
           + grid[y1][:, x0] * (1 - dx) * dy + grid[y1][:, x1] * dx * dy)
    return out.reshape(gh * gw, -1)


def block_order(gw: int, gh: int) -> np.ndarray:
    """The qwen3vl graph's patch order: 2 x 2 blocks in raster order, each block's four
    patches (dy, dx) in raster order; raster indices y * gw + x."""
    yb, xb, dy, dx = np.meshgrid(np.arange(gh // 2), np.arange(gw // 2), np.arange(2),
                                 np.arange(2), indexing="ij")
    return ((2 * yb + dy) * gw + (2 * xb + dx)).reshape(-1)


def vision_rope(x: np.ndarray, py: np.ndarray, px: np.ndarray, theta: float = 10000.0):
    """ggml_rope_multi(GGML_ROPE_TYPE_VISION, n_dims = d/2, sections [d/4] * 4), positions
    (y, x, y, x): pair (k, k + d/2) for k < d/2 turns by py * f_k (k < d/4) or px * f_(k-d/4)
    (k >= d/4), f_j = theta^(-4j/d). x [n, heads, d]."""
    d = x.shape[-1]
    f = theta ** (-4.0 * np.arange(d // 4) / d)
    ang = np.concatenate([py[:, None] * f, px[:, None] * f], axis=1)[:, None, :]
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def encode_qwen35(image_rgb_u8: np.ndarray, mmproj_path: str, *, ggml_rounding: bool = False,
                  **limits):
    """The soft tokens mtmd_get_output_embd returns for this image, [nx * ny, n_text] float64
    (token i at row i // nx, column i % nx of the merged grid), and (nx, ny). ggml_rounding:
    round to f16 where ggml's CPU backend does (im2col pixels, activations entering F16
    matrices, GELU's f16 table)."""
    hp, T, types = load_qwen35_mmproj(mmproj_path)
    assert hp["n_merge"] == 2, "the qwen3vl graph merges 2 x 2"
    assert hp["act"] == "gelu"
    P, D, nh, dh = hp["patch_size"], hp["n_embd"], hp["n_head"], hp["head_dim"]
    px_img = qwen35_preprocess(np.ascontiguousarray(image_rgb_u8, np.uint8), **limits)
    gh, gw = px_img.shape[0] // P, px_img.shape[1] // P
    mm = _linear(T, types, ggml_rounding)

    def gelu(a):
        return _activation(a, "gelu", ggml_rounding)

    h = _patch_embd(px_img, hp, T, types, ("v.patch_embd.weight", "v.patch_embd.weight.1"),
                    ggml_rounding)
    h = h + interp_align_corners(T["v.position_embd.weight"], gw, gh)
    order = block_order(gw, gh)
    h = h[order]
    py, px = (order // gw).astype(np.float64), (order % gw).astype(np.float64)
    n = h.shape[0]

    def qkv(t, b):
        x = mm(t, b + "attn_qkv.weight") + T[b + "attn_qkv.bias"]
        return (vision_rope(x[:, :D].reshape(n, nh, dh), py, px),
                vision_rope(x[:, D:2 * D].reshape(n, nh, dh), py, px),
                x[:, 2 * D:].reshape(n, nh, dh))

    h = _encoder_layers(h, hp, T, mm, gelu, qkv)
    t = gelu(mm(h.reshape(n // 4, 4 * D), "mm.0.weight") + T["mm.0.bias"])
    return mm(t, "mm.2.weight") + T["mm.2.bias"], (gw // 2, gh // 2)


def prompt_by_hand(mt: Mtmd, lctx, r: dict, image_pos: np.ndarray, after: int) -> np.ndarray:
    """The logits after the prompt, decoded without mtmd: the text before at 0.., the soft
    tokens r["embd"] at image_pos (causal, as mtmd decodes Qwen images), the text after at
    after.."""
    L = mt.L
    L.llama_memory_clear(L.llama_get_memory(lctx), True)
    nb, na = len(r["ids_before"]), len(r["ids_after"])
    mt.decode_batch(lctx, np.arange(nb), tokens=r["ids_before"])
    mt.decode_batch(lctx, image_pos, embd=r["embd"])
    mt.decode_batch(lctx, np.arange(after, after + na), tokens=r["ids_after"], logits_last=True)
    return mt.logits(lctx)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def text_positions(p0: int, n: int) -> np.ndarray:
    """The rope positions of n text tokens from p0 under M-RoPE: (p, p, p, 0) (llama-graph.cpp's
    llm_graph_input_pos::set_input)."""
    p = np.arange(p0, p0 + n, dtype=np.int32)
    return np.stack([p, p, p, np.zeros_like(p)], axis=1)


def qwen35_image_positions(nx: int, ny: int, pos_0: int) -> np.ndarray:
    """The rope positions of image token i, in section order (t, h, w, e): (pos_0,
    pos_0 + i // nx, pos_0 + i % nx, 0)."""
    i = np.arange(nx * ny)
    return np.stack([np.full_like(i, pos_0), pos_0 + i // nx, pos_0 + i % nx,
                     np.zeros_like(i)], axis=1).astype(np.int32)


def prompts_by_hand(mt: Mtmd, lctx, runs: dict, infos: dict) -> dict[str, list[np.ndarray]]:
    """Per image, prompt_by_hand's logits with the soft tokens at the positions mtmd recorded
    (they must be mtmd's) and at sequential positions (p, p, p, 0) (they are not)."""
    out = {}
    for n in IMAGE_NAMES:
        r, i = runs[n], infos[n]
        nb, k = len(r["ids_before"]), i["n_tokens"]
        out[n] = [prompt_by_hand(mt, lctx, r, i["image_pos"], nb + i["n_pos"]),
                  prompt_by_hand(mt, lctx, r, text_positions(nb, k), nb + k)]
    return out


def main_qwen35(args, log) -> None:
    from PIL import Image

    del args
    text_path, mmproj_path = SYNTH / Q_TEXT_FILE, SYNTH / Q_MMPROJ_FILE
    if not text_path.exists():
        raise RuntimeError(f"{text_path} missing: run make_synth_models.py first")
    make_qwen35_mmproj(mmproj_path)
    log_wrote(log, mmproj_path)
    check_dequant(mmproj_path)
    images = {n: np.asarray(Image.open(p).convert("RGB")) for n, p in IMAGE_PATHS.items()}

    runs, infos, mtmd_params, by_hand = run_mtmd(
        log, text_path, mmproj_path, images, Q_PROMPT, n_embd=msm.HYB_EMBD, mrope=True,
        image_max_tokens=Q_MAX_TOKENS, on_fresh=prompts_by_hand)

    for n in IMAGE_NAMES:
        r, i = runs[n], infos[n]
        nx, ny = i["grid"]
        h0, w0 = images[n].shape[:2]
        tw, th = qwen35_target_size(w0, h0)
        assert (nx, ny) == (tw // (2 * Q_PATCH), th // (2 * Q_PATCH)), (n, i["grid"], tw, th)
        assert i["n_tokens"] == nx * ny and i["n_pos"] == max(nx, ny) and not i["non_causal"]
        nb, na = len(r["ids_before"]), len(r["ids_after"])
        assert np.array_equal(i["image_pos"], qwen35_image_positions(nx, ny, nb)), n
        r["grid"] = np.array([nx, ny], np.int32)
        r["n_pos"] = np.int32(i["n_pos"])
        # every prompt token's 4 positions as llama.cpp's graph takes them
        r["positions"] = np.concatenate([text_positions(0, nb), i["image_pos"],
                                         text_positions(nb + i["n_pos"], na)])
        fit = fit_size(w0, h0, tw, th) if (tw, th) != (w0, h0) else (w0, h0, 0, 0)
        log(f"{n}.png {w0}x{h0}: to {tw}x{th} (resized to {fit[0]}x{fit[1]} at offset "
            f"({fit[2]}, {fit[3]})), grid {nx}x{ny} = {nx * ny} tokens, n_pos {i['n_pos']}; "
            f"prompt {nb} + {nx * ny} + {na} tokens at positions 0..{nb + i['n_pos'] + na - 1}")
        if (tw, th) != (w0, h0):
            ours = resize_u8(images[n], fit[0], fit[1], "bicubic")
            pil = np.asarray(Image.fromarray(images[n]).resize(fit[:2], Image.BICUBIC))
            log(f"  its bicubic resize, numpy vs Pillow's Image.resize(BICUBIC): "
                f"{int((ours != pil).sum())} of {ours.size} values differ")
    for n in IMAGE_NAMES:
        ref, (same, moved) = runs[n]["logits_steps"][0], by_hand[n]
        assert np.array_equal(same, ref), f"{n}: the recorded positions do not give mtmd's logits"
        log(f"{n}: the prompt by hand at the recorded positions gives mtmd's logits exactly; "
            f"with the image at sequential positions (p, p, p, 0) they move by max |diff| "
            f"{np.abs(moved - ref).max():.3f} (cosine {cosine(moved, ref):.5f})")

    def reference(n: str, ggml_rounding: bool) -> np.ndarray:
        e, grid = encode_qwen35(images[n], str(mmproj_path), ggml_rounding=ggml_rounding)
        assert grid == infos[n]["grid"], n
        return e

    log_checks(log, runs, reference, "soft token", f"{Q_TEXT_EMBD_RMS}")
    write_npz(log, Q_CASE, runs)
    write_entry(
        log, Q_CASE, text_path, mmproj_path, images, runs, infos, Q_PROMPT, mtmd_params,
        image_fields={n: {"grid": [int(g) for g in infos[n]["grid"]],
                          "n_image_tokens": int(infos[n]["n_tokens"]),
                          "n_pos": int(infos[n]["n_pos"])} for n in IMAGE_NAMES},
        # clip's token budget: mtmd_context_params.image_max_tokens (min: llama.cpp's 8)
        counts={"image_max_tokens": Q_MAX_TOKENS, "image_min_tokens": Q_MIN_TOKENS},
        exercises="make_synth_models.py's qwen35-f16 (gated delta-net layers 0-2, gated "
                  "attention on 3 with IMROPE sections [3, 3, 2, 0] over 16 of 64 dims) "
                  "taking image soft tokens at M-RoPE positions (t, t + row, t + column, "
                  "0), causally; text after the image at t + max(nx, ny). Image: "
                  "qwen3vl_merger (patch 16 as two conv kernels, 48 x 48 position "
                  "embeddings resized bilinear with aligned corners, 2 layers of 64, 2 "
                  "heads with 2-D vision rope, fused QKV, GELU, post_ln, 2 x 2 merge into "
                  "an MLP to 128), mtmd's dyn_size preprocessing (sides to multiples of "
                  "32 under image_max_tokens 256, bicubic letterbox on black).",
        continuation="argmax of the last logits, one llama_decode per token at position "
                     "n_past + i")


# -- main ----------------------------------------------------------------------------------------

def rel(a: np.ndarray, b: np.ndarray) -> float:
    """Relative Frobenius difference of a against the reference b."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def types_of(path: Path) -> dict[str, int]:
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def quiet_llama_cpp():
    """llama_backend_init and no logging from llama.cpp or mtmd; keep the callback alive."""
    import llama_cpp
    from llama_cpp import mtmd_cpp

    llama_cpp.llama_backend_init()
    quiet = llama_cpp.llama_log_callback(lambda *a: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_log_set(quiet, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_helper_log_set(quiet, ctypes.c_void_p(0))
    return quiet


def log_wrote(log, *paths: Path) -> None:
    for p in paths:
        log(f"wrote {p.relative_to(ROOT)}: {p.stat().st_size / 1e3:.1f} kB")


def check_dequant(*paths: Path) -> None:
    """Fail unless gguf.quants (what the tests read with) and ggml dequantize each GGUF alike."""
    import make_synth_reference as msr

    for p in paths:
        diff = msr.dequant_diff(p)
        if diff:
            raise RuntimeError(f"{p.name}: gguf.quants and ggml dequantize {diff} apart")


def run_mtmd(log, text_path: Path, mmproj_path: Path, images: dict[str, np.ndarray],
             prompt: str, *, n_embd: int, mrope: bool, image_max_tokens: int = -1,
             on_fresh=None):
    """Mtmd.run of prompt with each image on one llama context, then of square again on a
    fresh context, which must give the same numbers. n_embd: the text model's width (also
    that of its input); mrope: whether mtmd decodes with M-RoPE. on_fresh(mt, lctx, runs,
    infos), if given, runs on the fresh context after that. Returns runs, infos (by image
    name), Mtmd.params and what on_fresh returned."""
    import llama_cpp

    mt = Mtmd(text_path, mmproj_path, image_max_tokens=image_max_tokens)
    try:
        assert mt.n_embd == n_embd and mt.n_vocab == msm.N_VOCAB
        assert llama_cpp.llama_model_n_embd_inp(mt.model) == mt.n_embd
        assert bool(mt.M.mtmd_decode_use_mrope(mt.mctx)) == mrope
        lctx = mt.new_context()
        try:
            runs, infos = {}, {}
            for n in IMAGE_NAMES:
                runs[n], infos[n] = mt.run(lctx, IMAGE_PATHS[n], images[n], prompt)
        finally:
            llama_cpp.llama_free(lctx)
        lctx = mt.new_context()                 # the same again on a fresh context
        try:
            again, _ = mt.run(lctx, IMAGE_PATHS["square"], images["square"], prompt)
            extra = on_fresh(mt, lctx, runs, infos) if on_fresh else None
        finally:
            llama_cpp.llama_free(lctx)
        mtmd_params = mt.params
    finally:
        mt.close()
    for k, v in again.items():
        assert np.array_equal(v, runs["square"][k]), f"second square run differs in {k}"
    log("second run of square on a fresh context: identical")
    return runs, infos, mtmd_params, extra


def log_checks(log, runs: dict, reference, what: str, text_rms: str) -> None:
    """Print square against wide (the soft tokens both have, the logits after the prompt), then
    per image the soft tokens' RMS beside text_rms (that of the token embeddings), their
    relative error against reference(name, ggml_rounding) (the float64 encoder), the prompt's
    ids and the continuation. what: the soft tokens' name in the lines."""
    sq, wd = runs["square"], runs["wide"]
    n_cmp = min(len(sq["embd"]), len(wd["embd"]))
    first = "" if len(sq["embd"]) == len(wd["embd"]) else f" (first {n_cmp})"
    log(f"{what}s, square vs wide{first}: relative Frobenius difference "
        f"{rel(sq['embd'][:n_cmp], wd['embd'][:n_cmp]):.3f}")
    log(f"logits after the prompt, square vs wide: max |diff| "
        f"{np.abs(sq['logits_steps'][0] - wd['logits_steps'][0]).max():.3f} "
        f"(logit std {sq['logits_steps'][0].std():.3f}, {wd['logits_steps'][0].std():.3f})")
    for n in IMAGE_NAMES:
        e = runs[n]["embd"]
        plain, rounded = reference(n, False), reference(n, True)
        steps = np.sort(runs[n]["logits_steps"], axis=1)
        log(f"{n}: {what} RMS {np.sqrt((e.astype(np.float64) ** 2).mean()):.3f} (token "
            f"embeddings {text_rms}); llama.cpp vs float64 reference: relative error "
            f"{rel(e, plain):.2e}, {rel(e, rounded):.2e} with ggml's f16 rounding; max |diff| "
            f"{np.abs(e - rounded).max():.2e}")
        log(f"{n}: ids before {runs[n]['ids_before'].tolist()}")
        log(f"{n}: ids after {runs[n]['ids_after'].tolist()}")
        log(f"{n}: continuation {runs[n]['continuation_ids'].tolist()}, smallest top-2 gap "
            f"{(steps[:, -1] - steps[:, -2]).min():.3f}")


def write_npz(log, case: str, runs: dict, data: dict | None = None) -> None:
    """SYNTH/<case>.npz: data, then IMG_key for each image IMG and key of runs[IMG]."""
    data = dict(data or {})
    for n in IMAGE_NAMES:
        for k, v in runs[n].items():
            data[f"{n}_{k}"] = v
    path = SYNTH / f"{case}.npz"
    np.savez_compressed(path, **data)
    log_wrote(log, path)


def write_entry(log, case: str, text_path: Path, mmproj_path: Path,
                images: dict[str, np.ndarray], runs: dict, infos: dict, prompt: str,
                mtmd_params: dict, *, counts: dict, exercises: str, continuation: str,
                image_fields: dict | None = None) -> None:
    """Put the case's entry among index.json's "vision_cases", replacing the one of its name:
    the files and their sha256, each image's file, size and image_fields[name], the family's
    token counts (counts, after "data"), the prompt and the settings (continuation: how the
    greedy tokens are decoded)."""
    import llama_cpp

    entry = {
        "name": case, "model_file": text_path.name, "model_sha256": sha256(text_path),
        "mmproj_file": mmproj_path.name, "mmproj_sha256": sha256(mmproj_path),
        "image_dir": str(IMAGES.relative_to(ROOT)),
        "images": {n: {"file": p.name, "sha256": sha256(p),
                       "width": int(images[n].shape[1]), "height": int(images[n].shape[0]),
                       **(image_fields or {}).get(n, {})}
                   for n, p in IMAGE_PATHS.items()},
        "n_ctx": N_CTX, "data": f"{case}.npz", **counts,
        "n_prompt": {n: len(runs[n]["ids_before"]) + int(infos[n]["n_tokens"])
                     + len(runs[n]["ids_after"]) for n in IMAGE_NAMES},
        "n_continuation": N_CONT, "weight_types": types_of(text_path),
        "mmproj_weight_types": types_of(mmproj_path),
        "exercises": exercises,
        "gguf_quants_equals_ggml_to_float": True,
        "llama_cpp_python_version": llama_cpp.__version__,
        "prompt_text": prompt,
        "settings": {"backend": "CPU", "n_threads": N_THREADS, "n_ctx": N_CTX,
                     "n_batch": N_BATCH, "n_ubatch": N_BATCH, "flash_attn": False,
                     "type_k": "f16", "type_v": "f16",
                     "mtmd": mtmd_params, "mtmd_tokenize": {"add_special": True,
                                                            "parse_special": True},
                     "image_input": "mtmd_helper_bitmap_init_from_file (PNG decoded by mtmd)",
                     "prompt": f"mtmd_helper_eval_chunks, n_batch {N_BATCH}, logits of the "
                               "last token",
                     "continuation": continuation,
                     "between_images": "llama_memory_clear"},
    }
    index_path = SYNTH / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {"cases": []}
    cases = index.get("vision_cases", [])
    names = [c["name"] for c in cases]
    if case in names:
        cases[names.index(case)] = entry
    else:
        cases.append(entry)
    index["vision_cases"] = cases
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    log(f"wrote the {case} entry of {index_path.relative_to(ROOT)}")


def main_gemma3(args, log) -> None:
    from PIL import Image

    SYNTH.mkdir(parents=True, exist_ok=True)
    text_path, mmproj_path = SYNTH / TEXT_FILE, SYNTH / MMPROJ_FILE
    make_gemma3(text_path, msm.small_vocab(args.tokenizer))
    make_mmproj(mmproj_path)
    images = write_images(IMAGES)
    log_wrote(log, text_path, mmproj_path, *IMAGE_PATHS.values())
    check_dequant(text_path, mmproj_path)

    runs, infos, mtmd_params, _ = run_mtmd(log, text_path, mmproj_path, images, PROMPT,
                                           n_embd=msm.N_EMBD, mrope=False)
    for n in IMAGE_NAMES:
        i = infos[n]
        assert i["n_tokens"] == N_IMG_TOKENS and i["n_pos"] == N_IMG_TOKENS, i
        assert i["non_causal"] and "image_pos" not in i, i

    # the checks
    nw, nh, ox, oy = letterbox_size(640, 400, IMG_SIZE)
    ours = resize_u8(images["wide"], nw, nh)
    pil = np.asarray(Image.fromarray(images["wide"]).resize((nw, nh), Image.BILINEAR))
    log(f"wide.png letterboxed to {nw}x{nh} at offset ({ox}, {oy}); numpy resize vs Pillow: "
        f"{int((ours != pil).sum())} of {ours.size} values differ")
    log_checks(log, runs,
               lambda n, rounding: encode(images[n], str(mmproj_path), ggml_rounding=rounding),
               "embedding", f"enter at {IMG_EMBD_RMS:.3f}")
    write_npz(log, CASE, runs, {"n_image_tokens": np.int32(N_IMG_TOKENS)})
    write_entry(
        log, CASE, text_path, mmproj_path, images, runs, infos, PROMPT, mtmd_params,
        counts={"n_image_tokens": N_IMG_TOKENS},
        exercises=" ".join(make_gemma3.__doc__.split()) + " Image: "
                  "SigLIP (896 px, patch 14, 2 layers of 64, 2 heads, GELU), gemma3 "
                  "projector (4x4 average pool to 256 tokens, soft_emb RMS norm, input "
                  "projection), mtmd's letterbox resize, non-causal image decode.",
        continuation="argmax of the last logits, one llama_decode per token")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, default=msm.TOKENIZER)
    ap.add_argument("--family", choices=("all", "gemma3", "qwen35"), default="all",
                    help="which vision case to write (default: both, Gemma 3 first, as it "
                         "draws the images Qwen3.5 reads)")
    args = ap.parse_args()
    log = lambda *a: print(*a, file=sys.stderr)     # noqa: E731
    if args.family in ("all", "gemma3"):
        main_gemma3(args, log)
    if args.family in ("all", "qwen35"):
        main_qwen35(args, log)


if __name__ == "__main__":
    main()
