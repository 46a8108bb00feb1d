"""`hotseat bench --image IMG --mmproj P -m M`: the time to the first token of a one-image
prompt, beside llama-server --mmproj on the same files (--vs-llama-server).

Each repeat is a user message of the image and a short question, answered with one token
from an empty cache: the image is encoded, its soft tokens and the text run through the
model, and the first token sampled (greedy). So that nothing of an earlier repeat is reused
(Hotseat keeps recent images' soft tokens and its prompt cache; llama-server its own), every
repeat's image differs from the others in one pixel, and llama-server is asked with
`cache_prompt: false`. Medians over the repeats, after a warm-up that records the graphs.
"""
from __future__ import annotations

import base64
import io
import json
import os
import statistics
import sys
import time
import urllib.request

import numpy as np

QUESTION = "What is in this picture?"


def _images(path: str, n: int) -> list[np.ndarray]:
    """n RGB arrays of the image, each with its own first pixel."""
    from ..vision.image import Image

    with open(path, "rb") as f:
        rgb = Image.from_bytes(f.read()).rgb
    out = []
    for i in range(n):
        a = rgb.copy()
        a[0, 0] = [(i * 37) % 256, (i * 91) % 256, (i * 53) % 256]
        out.append(a)
    return out


def _png(rgb: np.ndarray) -> bytes:
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def run_image_bench(args) -> int:
    from ..api import Engine
    from ..facade import Request
    from ..formats.bundled import resolve
    from ..text.sampling import SamplingParams
    from ..vision.image import Image
    from ..vision.prompt import MARKER

    if args.repeats < 1:
        raise ValueError("need -r >= 1")
    path = resolve(args.model)
    arrays = _images(args.image, args.repeats + 1)
    greedy = SamplingParams(temperature=0.0)
    ours = []
    with Engine(n_ctx=args.ctx, flash_attn=args.flash_attn, prompt_cache=False,
                arena=False) as eng:
        name = eng.load(path, mmproj=args.mmproj)
        for i, rgb in enumerate(arrays):        # the first: the warm-up
            image = Image.from_rgb(rgb)
            t0 = time.perf_counter()
            out = eng.generate(Request(name, messages=[{"role": "user",
                                                        "content": MARKER + QUESTION}],
                                       images=[image], max_tokens=1, sampling=greedy))
            if i:
                ours.append(time.perf_counter() - t0)
        n_prompt = len(out.prompt_tokens)
        device = eng.device_name
    rows = [{"engine": "hotseat", "device": device, "ttft_s": statistics.median(ours),
             "samples": ours}]
    if args.vs_llama_server is not None:
        rows.append(_llama_server(args, path, arrays))
    report = {"model": os.path.basename(path), "mmproj": os.path.basename(args.mmproj),
              "image": os.path.basename(args.image), "prompt_tokens": n_prompt,
              "repeats": args.repeats, "rows": rows}
    if len(rows) > 1:
        report["llama_server_over_hotseat"] = rows[1]["ttft_s"] / rows[0]["ttft_s"]
    if args.json:
        print(json.dumps(report))
    else:
        print(f"model: {report['model']} with {report['mmproj']}, image {report['image']} "
              f"({n_prompt} prompt tokens), median of {args.repeats}")
        for r in rows:
            print(f"| {r['engine']:<24} | {r['device'][:34]:<34} | first token "
                  f"{1e3 * r['ttft_s']:9.1f} ms |")
        if "llama_server_over_hotseat" in report:
            print(f"llama-server / hotseat = {report['llama_server_over_hotseat']:.2f}x")
        sys.stdout.flush()
    return 0


def _llama_server(args, path: str, arrays: list[np.ndarray]) -> dict:
    from .peer import LlamaServer, find_llama_server

    server = find_llama_server(args.vs_llama_server or None)
    times = []
    with LlamaServer(server, path, n_ctx=args.ctx,
                     extra_args=["--mmproj", args.mmproj, "-ngl", "99"]) as peer:
        for i, rgb in enumerate(arrays):
            url = "data:image/png;base64," + base64.b64encode(_png(rgb)).decode()
            body = {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": QUESTION}]}],
                "max_tokens": 1, "temperature": 0, "cache_prompt": False}
            req = urllib.request.Request(peer.url + "/v1/chat/completions",
                                         json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=600) as r:
                r.read()
            if i:
                times.append(time.perf_counter() - t0)
        device = peer.device_name()
    return {"engine": "llama.cpp llama-server", "device": device,
            "ttft_s": statistics.median(times), "samples": times}
