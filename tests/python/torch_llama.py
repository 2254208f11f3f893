#!/usr/bin/env python3
"""An independent PyTorch implementation of the Llama forward pass, written from Hugging
Face's LlamaForCausalLM formulas (modeling_llama.py), to check meshtrain's Llama against;
and Mixtral's (modeling_mixtral.py, MixtralSparseMoeBlock) when config.json says
model_type mixtral: every MLP a router over num_local_experts SwiGLU experts, the softmax
over all of them in float, the top num_experts_per_tok renormalised.

    torch_llama.py eval FOLDER --data TOKENS.bin --batch B --seq T --batches K [--double]

FOLDER is what `meshtrain train --export FOLDER` writes: config.json (LlamaConfig fields)
and model.safetensors (LlamaForCausalLM names). Prints {"loss": mean cross-entropy} over K
batches from the start of the llm.c token file, batch k reading tokens [k·B·T, (k+1)·B·T + 1),
as `meshtrain eval` does. Reads files with bench/torch_gpt.py's readers (safetensors, llm.c);
the model below shares nothing with meshtrain's C++.
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from torch_gpt import batch_at, load_safetensors, read_tokens  # noqa: E402

# Tests break one formula on purpose to show that the comparison would catch it:
# TORCH_LLAMA_BREAK=rope_scaling (ignored) or rotate_half (the other sign); for Mixtral
# moe_renormalise (the top-k probabilities used as they are) or moe_top1 (one expert).
BREAK = os.environ.get("TORCH_LLAMA_BREAK", "")


def rope_inv_freq(cfg, head_dim):
    """_compute_default_rope_parameters, then _compute_llama3_parameters when rope_scaling
    says llama3 (in float64 here)."""
    base = float(cfg.get("rope_theta", 10000.0))
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    rs = cfg.get("rope_scaling")
    if not rs or BREAK == "rope_scaling":
        return inv
    if rs.get("rope_type", rs.get("type")) != "llama3":
        raise SystemExit(f"rope_scaling {rs} is not llama3")
    factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old = float(rs["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, inv_l)


def rotate_half(x):
    half = x.shape[-1] // 2
    if BREAK == "rotate_half":
        return torch.cat((x[..., half:], -x[..., :half]), dim=-1)
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Llama:
    def __init__(self, cfg, w, dtype):
        self.cfg, self.dtype = cfg, dtype
        self.w = {k: v.to(dtype) for k, v in w.items()}
        self.L = cfg["num_hidden_layers"]
        self.H = cfg["num_attention_heads"]
        self.KV = cfg.get("num_key_value_heads", self.H)
        self.C = cfg["hidden_size"]
        self.hd = self.C // self.H
        self.eps = float(cfg["rms_norm_eps"])
        self.inv_freq = rope_inv_freq(cfg, self.hd)
        self.experts = cfg.get("num_local_experts") or 0
        self.top_k = cfg.get("num_experts_per_tok") or 0
        if cfg.get("tie_word_embeddings"):
            self.w.setdefault("lm_head.weight", self.w["model.embed_tokens.weight"])

    def rms(self, x, weight):
        var = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(var + self.eps))

    def __call__(self, idx, targets):
        B, T = idx.shape
        w = self.w
        x = w["model.embed_tokens.weight"][idx]
        ang = torch.arange(T, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        mask = torch.full((T, T), float("-inf"), dtype=self.dtype).triu(1)
        for i in range(self.L):
            p = f"model.layers.{i}."
            h = self.rms(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, self.H, self.hd).transpose(1, 2)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, self.KV, self.hd).transpose(1, 2)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, self.KV, self.hd).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            g = self.H // self.KV  # repeat_kv
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
            y = torch.softmax(att, dim=-1) @ v
            y = y.transpose(1, 2).reshape(B, T, self.C)
            x = x + y @ w[p + "self_attn.o_proj.weight"].T
            h = self.rms(x, w[p + "post_attention_layernorm.weight"])
            if self.experts:
                x = x + self.sparse_moe(h, p + "block_sparse_moe.")
                continue
            gate = h @ w[p + "mlp.gate_proj.weight"].T
            up = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        x = self.rms(x, w["model.norm.weight"])
        logits = x @ w["lm_head.weight"].T
        return torch.nn.functional.cross_entropy(logits.view(B * T, -1), targets.view(-1))


    def sparse_moe(self, h, p):
        """MixtralSparseMoeBlock.forward: token by token through its chosen experts."""
        w = self.w
        B, T, C = h.shape
        flat = h.reshape(-1, C)
        probs = torch.softmax(flat @ w[p + "gate.weight"].T, dim=-1)
        k = 1 if BREAK == "moe_top1" else self.top_k
        weights, chosen = torch.topk(probs, k, dim=-1)
        if BREAK != "moe_renormalise":
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e in range(self.experts):
            rows, slot = torch.where(chosen == e)
            if rows.numel() == 0:
                continue
            q = f"{p}experts.{e}."
            xe = flat[rows]
            ye = (torch.nn.functional.silu(xe @ w[q + "w1.weight"].T) * (xe @ w[q + "w3.weight"].T)) @ w[q + "w2.weight"].T
            out.index_add_(0, rows, ye * weights[rows, slot, None])
        return out.view(B, T, C)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("folder")
    e.add_argument("--data", required=True)
    e.add_argument("--batch", type=int, default=2)
    e.add_argument("--seq", type=int, default=32)
    e.add_argument("--batches", type=int, default=1)
    e.add_argument("--double", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with open(os.path.join(a.folder, "config.json")) as f:
        cfg = json.load(f)
    if (cfg.get("model_type"), cfg.get("architectures")) not in (
            ("llama", ["LlamaForCausalLM"]), ("mixtral", ["MixtralForCausalLM"])):
        raise SystemExit(f"{a.folder}/config.json describes neither a LlamaForCausalLM nor a MixtralForCausalLM")
    weights, _ = load_safetensors(os.path.join(a.folder, "model.safetensors"))
    dtype = torch.float64 if a.double else torch.float32
    model = Llama(cfg, weights, dtype)
    tokens = read_tokens(a.data)
    total = 0.0
    with torch.no_grad():
        for k in range(a.batches):
            x, y = batch_at(tokens, k * a.batch * a.seq, a.batch, a.seq)
            total += float(model(x, y))
    print(json.dumps({"loss": total / a.batches}))


if __name__ == "__main__":
    main()
