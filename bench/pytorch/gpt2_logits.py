#!/usr/bin/env python3
"""GPT-2 logits from PyTorch for the same weights memgrad loads (examples:gpt2 --init-from).

  gpt2_logits.py --weights W.safetensors                       # writes random GPT-2 weights (if W
                                                                # is absent) and prints PyTorch's logits
  gpt2 --init-from W.safetensors --print-logits --logits-out M.safetensors
  gpt2_logits.py --weights W.safetensors --compare M.safetensors   # PASS/FAIL, max differences

The weights are random (seeded) in Hugging Face's GPT-2 layout: wte, wpe, h.N.ln_1,
h.N.attn.c_attn (Conv1D: weight [in, out]), h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc,
h.N.mlp.c_proj, ln_f; the head is tied to wte. The model is plain torch code (no transformers
needed); when transformers is importable, GPT2LMHeadModel is run on the same weights as a check
of this file. Prints one JSON line in examples:gpt2 --print-logits' format (tokens, shape, first5,
argmax, sum). f32 everywhere with TF32 off.
"""
import argparse
import ctypes
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

TOKENS = [15496, 11, 314, 1101, 257, 3303, 2746, 13]  # "Hello, I'm a language model."


def save_safetensors(tensors, path):
    try:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})
        return
    except ImportError:
        pass
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().float().cpu().contiguous()
        b = ctypes.string_at(t.data_ptr(), t.numel() * 4)
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", f"{path}: {name} is {info['dtype']}, this reader takes F32 only"
        a, b = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(info["shape"])
    return out


def random_weights(L, C, V, T, seed):
    g = torch.Generator().manual_seed(seed)
    w = {}

    def put(name, shape, std, mean=0.0):
        w[name] = torch.randn(*shape, generator=g) * std + mean

    put("wte.weight", (V, C), 0.02)
    put("wpe.weight", (T, C), 0.01)
    for l in range(L):
        p = f"h.{l}."
        for ln in ("ln_1", "ln_2"):
            put(p + ln + ".weight", (C,), 0.1, 1.0)
            put(p + ln + ".bias", (C,), 0.1)
        put(p + "attn.c_attn.weight", (C, 3 * C), 0.02)
        put(p + "attn.c_attn.bias", (3 * C,), 0.02)
        put(p + "attn.c_proj.weight", (C, C), 0.02 / math.sqrt(2 * L))
        put(p + "attn.c_proj.bias", (C,), 0.02)
        put(p + "mlp.c_fc.weight", (C, 4 * C), 0.02)
        put(p + "mlp.c_fc.bias", (4 * C,), 0.02)
        put(p + "mlp.c_proj.weight", (4 * C, C), 0.02 / math.sqrt(2 * L))
        put(p + "mlp.c_proj.bias", (C,), 0.02)
    put("ln_f.weight", (C,), 0.1, 1.0)
    put("ln_f.bias", (C,), 0.1)
    return w


def gpt2_forward(w, idx, n_head):
    """GPT-2 from the Hugging Face tensors: Conv1D is x @ W + b with W [in, out]."""
    B, T = idx.shape
    C = w["wte.weight"].shape[1]
    L = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("h."))
    x = w["wte.weight"][idx] + w["wpe.weight"][:T]
    ln = lambda x, n: F.layer_norm(x, (C,), w[n + ".weight"], w[n + ".bias"], 1e-5)
    conv1d = lambda x, n: x @ w[n + ".weight"] + w[n + ".bias"]
    for l in range(L):
        p = f"h.{l}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        heads = lambda t: t.view(B, T, n_head, C // n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + conv1d(y.transpose(1, 2).reshape(B, T, C), p + "attn.c_proj")
        x = x + conv1d(F.gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh"), p + "mlp.c_proj")
    return ln(x, "ln_f") @ w["wte.weight"].t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--compare", help="memgrad's --logits-out file")
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--n-head", type=int, default=0, help="default n_embd / 64")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--block-size", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="largest |difference| / max |logit| that passes (f32 sums of <= 3072 products in "
                         "another order differ by ~1e-6 of the largest; TF32 would be ~1e-3)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if not os.path.exists(a.weights):
        save_safetensors(random_weights(a.n_layer, a.n_embd, a.vocab, a.block_size, a.seed), a.weights)
        print(f"wrote random GPT-2 weights to {a.weights}", file=sys.stderr)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    w = {k: v.to(dev) for k, v in load_safetensors(a.weights).items()}
    C = w["wte.weight"].shape[1]
    n_head = a.n_head or max(1, C // 64)
    idx = torch.tensor([TOKENS], device=dev)
    with torch.no_grad():
        logits = gpt2_forward(w, idx, n_head)[0].float().cpu()
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
            L = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("h."))
            cfg = GPT2Config(vocab_size=w["wte.weight"].shape[0], n_positions=w["wpe.weight"].shape[0], n_embd=C,
                             n_layer=L, n_head=n_head, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
            hf = GPT2LMHeadModel(cfg).to(dev).eval()
            hf.transformer.load_state_dict(w, strict=False)
            hf.tie_weights()
            d = (hf(idx).logits[0].float().cpu() - logits).abs().max().item()
            print(f"transformers GPT2LMHeadModel vs this file's forward: max |diff| {d:.3g}", file=sys.stderr)
        except ImportError:
            pass
    T, V = logits.shape
    print(json.dumps({"tokens": TOKENS, "shape": [T, V], "first5": logits[:, :5].tolist(),
                      "argmax": logits.argmax(1).tolist(), "sum": logits.double().sum().item()}))
    if a.compare:
        m = load_safetensors(a.compare)["logits"]
        assert m.shape == logits.shape, f"memgrad logits {list(m.shape)} vs PyTorch {list(logits.shape)}"
        diff = (m - logits).abs().max().item()
        scale = logits.abs().max().item()
        agree = (m.argmax(1) == logits.argmax(1)).float().mean().item()
        ok = diff <= a.tol * scale
        print(f"{'PASS' if ok else 'FAIL'}: max |memgrad - PyTorch| {diff:.3g}, max |logit| {scale:.3g}, "
              f"ratio {diff / scale:.3g} (tol {a.tol}), argmax agreement {agree:.3f}")
        sys.exit(0 if ok else 1)


main()
