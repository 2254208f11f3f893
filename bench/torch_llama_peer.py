#!/usr/bin/python3
"""PyTorch peer of meshtrain's Llama for the training-throughput benchmark (bench/vs-pytorch-llama).

The model is Hugging Face's LlamaForCausalLM written out in plain PyTorch 1.13 ops, at its
fastest in eager mode on a CPU: RMSNorm (eps 1e-5), rotary embeddings on q and k with
`rotate_half` (cos/sin computed once per run), grouped-query attention (k and v expanded to
the query heads as HF's `repeat_kv` does, one batched matmul for scores and one for the
values, causal mask, softmax), SwiGLU MLP down(silu(gate(x)) * up(x)), no biases, tied LM
head, mean cross-entropy. Training matches meshtrain's: AdamW (0.9, 0.95), eps 1e-8, weight
decay 0.1 on matrices, clip 1.0.

    torch_llama_peer.py train --n-layer 12 --d-model 768 --n-head 12 --n-kv-head 4 \\
        --d-ff 2048 --vocab 32000 --seq 256 --batch 4 --steps 6 --threads 1 \\
        --dtype f32|bf16 --data TOKENS.bin

bf16 is `torch.autocast("cpu", dtype=torch.bfloat16)` around the forward (oneDNN's bf16
GEMMs; f32 weights, gradients and optimizer state), as PyTorch users train in bf16 on CPUs.
The last stdout line is JSON with tokens_per_s over the steps after the first 2.

This is a benchmark peer; the independent reference that checks meshtrain's Llama numbers is
tests/python/torch_llama.py.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import UsageError, batch_at, make_optimizer, read_tokens  # noqa: E402


class RmsNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        # HF computes the statistic in f32 whatever the activation dtype.
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, d, n_head, n_kv):
        super().__init__()
        self.h, self.kv, self.hd = n_head, n_kv, d // n_head
        self.q_proj = nn.Linear(d, n_head * self.hd, bias=False)
        self.k_proj = nn.Linear(d, n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(n_head * self.hd, d, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.h // self.kv
        if rep > 1:  # HF's repeat_kv: kv head j serves query heads j*rep .. j*rep + rep - 1
            k = k[:, :, None].expand(b, self.kv, rep, t, self.hd).reshape(b, self.h, t, self.hd)
            v = v[:, :, None].expand(b, self.kv, rep, t, self.hd).reshape(b, self.h, t, self.hd)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = torch.matmul(att.to(v.dtype), v).transpose(1, 2).reshape(b, t, self.h * self.hd)
        return self.o_proj(y)


class Mlp(nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.input_layernorm = RmsNorm(d, cfg["eps"])
        self.self_attn = Attention(d, cfg["n_head"], cfg["n_kv_head"])
        self.post_attention_layernorm = RmsNorm(d, cfg["eps"])
        self.mlp = Mlp(d, cfg["d_ff"])

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg["vocab"], cfg["d_model"])
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["n_layer"]))
        self.norm = RmsNorm(cfg["d_model"], cfg["eps"])
        hd = cfg["d_model"] // cfg["n_head"]
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.arange(cfg["seq"], dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)
        t = cfg["seq"]
        self.register_buffer("mask", torch.ones(t, t, dtype=torch.bool).triu_(1), persistent=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin, mask = self.cos[:t], self.sin[:t], self.mask[:t, :t]
        for block in self.layers:
            x = block(x, cos, sin, mask)
        logits = F.linear(self.norm(x), self.embed_tokens.weight)  # tied LM head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def init_weights(self, seed, std=0.02):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    s = std / math.sqrt(2 * self.cfg["n_layer"]) if name.endswith(
                        ("o_proj.weight", "down_proj.weight")) else std
                    p.normal_(0.0, s, generator=g)
        return self


def cmd_train(args):
    if args.steps < 3:
        raise UsageError(f"--steps {args.steps}: need at least 3 (the first 2 are warm-up)")
    if args.d_model % args.n_head or args.n_head % args.n_kv_head:
        raise UsageError(f"--n-head {args.n_head} must divide --d-model {args.d_model} and be a "
                         f"multiple of --n-kv-head {args.n_kv_head}")
    cfg = {"n_layer": args.n_layer, "d_model": args.d_model, "n_head": args.n_head,
           "n_kv_head": args.n_kv_head, "d_ff": args.d_ff, "vocab": args.vocab,
           "seq": args.seq, "rope_theta": args.rope_theta, "eps": 1e-5}
    tokens = read_tokens(args.data)
    n = args.batch * args.seq
    if tokens.size < n + 1:
        raise UsageError(f"{args.data} holds {tokens.size} tokens; one batch needs {n + 1}")
    if int(tokens.max()) >= args.vocab:
        raise UsageError(f"token {int(tokens.max())} in {args.data} is >= --vocab {args.vocab}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = Llama(cfg).init_weights(args.seed)
    model.train()
    opt = make_optimizer(model, args.lr)
    bf16 = args.dtype == "bf16"
    windows = (tokens.size - 1) // n
    times = []
    for step in range(args.steps):
        x, y = batch_at(tokens, (step % windows) * n, args.batch, args.seq)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = float(loss)
        dt = time.perf_counter() - t0
        times.append(dt)
        if not math.isfinite(lv):
            print(f"step {step}: loss is {lv}", file=sys.stderr)
            return 1
        print(json.dumps({"step": step, "loss": lv, "grad_norm": float(grad_norm), "time_s": dt,
                          "tokens_per_s": n / dt}), file=sys.stderr)
    timed = times[2:]
    print(json.dumps({"tokens_per_s": n * len(timed) / sum(timed),
                      "step_time_s": sum(timed) / len(timed), "steps": args.steps,
                      "threads": args.threads, "dtype": args.dtype, "batch": args.batch,
                      "seq": args.seq, "params": sum(p.numel() for p in model.parameters())}),
          flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train", help="train; last stdout line is JSON with tokens_per_s")
    for flag in ("--n-layer", "--d-model", "--n-head", "--n-kv-head", "--d-ff", "--vocab",
                 "--seq", "--batch"):
        t.add_argument(flag, type=int, required=True)
    t.add_argument("--rope-theta", type=float, default=500000.0)
    t.add_argument("--steps", type=int, default=6)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    t.add_argument("--data", required=True)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    try:
        return cmd_train(args)
    except UsageError as e:
        print(f"torch_llama_peer.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
