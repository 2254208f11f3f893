#!/usr/bin/env python3
"""PyTorch peer of meshtrain's GPU benchmark: GPT-2 training throughput as PyTorch users run it.

The model is the usual nanoGPT-style GPT-2: token + position embeddings, pre-LN blocks
(LayerNorm with bias, eps 1e-5), fused qkv Linear with bias, F.scaled_dot_product_attention
(is_causal=True), MLP 4*C with tanh GELU, final LayerNorm, LM head tied to the token
embedding; dropout 0. The vocabulary is padded to a multiple of 128 exactly as meshtrain pads
it (model::GptConfig::padded_vocab: 50257 -> 50304), so both sides do the same GEMMs; the
cross-entropy runs over the padded logits (nanoGPT / llm.c do the same; meshtrain masks the
padded columns, which changes no GEMM). Training step = forward + backward + grad-norm clip
at 1.0 (meshtrain clips by default) + AdamW(0.9, 0.95, eps 1e-8, wd 0.1 on matrices) with
fused=True + zero_grad(set_to_none). bf16 autocast over fp32 master weights.

Modes: eager, compile (torch.compile(model), default mode; its compile time is warm-up and is
reported, not timed). Timing: CUDA events around every step, after warm-up; the median step
gives tokens/s. MFU uses meshtrain's FLOPs per token (docs/flops.md,
model::training_flops_per_token): 6 * P_matmul + 12 * L * C * T, with
P_matmul = L * (4 C^2 + 2 C F) + Vp * C, against the bf16 GEMM peak measured here (median of
8192^3 bf16 matmuls, random data) and against the nominal 989 TFLOP/s (H100/H200 SXM dense).

Output: JSON lines on stdout (kinds: env, peak, probe, skip, result, error); also appended to
--out if given. Exit 0 when every requested mode produced a result or was skipped as
unavailable; 1 when a mode failed.

Runs on the CPU too (--device cpu --tiny) so the logic can be tested without a GPU, with
torch 1.13 (Debian's): scaled_dot_product_attention, fused AdamW and torch.compile are then
replaced by an explicit attention, foreach AdamW and a skip message.

Examples:
  python3 bench/gpu/torch_gpt2.py --shape 124m --mode both            # batch: largest that fits
  python3 bench/gpu/torch_gpt2.py --shape 350m --mode eager --batch 16 --peak-tflops 780
  python3 bench/gpu/torch_gpt2.py --peak-only
  /usr/bin/python3 bench/gpu/torch_gpt2.py --device cpu --tiny --mode both --steps 4
"""

import argparse
import gc
import inspect
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB_PAD_MULTIPLE = 128  # src/model/config.h kVocabPadMultiple
NOMINAL_TFLOPS = 989.0    # H100 / H200 SXM dense bf16, datasheet

# name -> (n_layer, n_head, d_model, vocab, seq); d_ff = 4 * d_model (meshtrain's presets)
SHAPES = {
    "124m": (12, 12, 768, 50257, 1024),   # meshtrain --model gpt2-124m
    "350m": (24, 16, 1024, 50257, 1024),  # meshtrain --model gpt2-350m
    "tiny": (2, 4, 64, 500, 64),          # logic check on a CPU
}

OUT_FILE = None


def emit(**row):
    line = json.dumps(row, sort_keys=False)
    print(line, flush=True)
    if OUT_FILE:
        with open(OUT_FILE, "a") as f:
            f.write(line + "\n")


def padded_vocab(v):
    return (v + VOCAB_PAD_MULTIPLE - 1) // VOCAB_PAD_MULTIPLE * VOCAB_PAD_MULTIPLE


def flops_per_token(L, C, F_, Vp, T):
    """meshtrain's model::training_flops_per_token (src/model/gpt.cpp)."""
    p_matmul = L * (3 * C * C + C * C + 2 * C * F_) + Vp * C
    return 6.0 * p_matmul + 12.0 * L * C * T, p_matmul


HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class Attention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.n_head = H
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hd = C // self.n_head
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (the CPU logic check only)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu_(1)
            y = att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, C, H, F_):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(C, H)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, F_)
        self.c_proj = nn.Linear(F_, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, L, H, C, Vp, T):
        super().__init__()
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H, 4 * C) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.lm_head = nn.Linear(C, Vp, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        resid_std = 0.02 / math.sqrt(2 * L)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, resid_std if name.endswith("c_proj.weight") else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:T]
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def make_optimizer(model, device):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    params = inspect.signature(torch.optim.AdamW).parameters
    if "fused" in params:
        try:
            return torch.optim.AdamW(groups, fused=True, **kw), "fused"
        except (RuntimeError, TypeError, ValueError):
            pass  # fused AdamW needs CUDA tensors on older torch
    return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"


def is_oom(e):
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(e, oom_type):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def free_memory(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class Timer:
    """CUDA events on the GPU, perf_counter on the CPU; times in ms."""

    def __init__(self, device):
        self.device = device
        self.marks = []

    def mark(self):
        if self.device == "cuda":
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [1000 * (b - a) for a, b in zip(self.marks, self.marks[1:])]


def measure_peak(device, n, reps=20, warmup=3):
    """bf16 GEMM rate of an n x n x n matmul on random data: median over reps, TFLOP/s."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
    for _ in range(warmup):
        c = a @ b
    times = []
    for _ in range(reps):
        t = Timer(device)
        t.mark()
        c = a @ b
        t.mark()
        times.append(t.intervals_ms()[0])
    del a, b, c
    free_memory(device)
    ms = statistics.median(times)
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12, ms, min(times)


class Run:
    """One model + optimizer + data at one batch size."""

    def __init__(self, args, batch, compiled):
        L, H, C, V, T = SHAPES[args.shape]
        # Testing the batch search without a GPU: batches above this "run out of memory".
        fake = os.environ.get("TORCH_GPT2_FAKE_OOM_ABOVE")
        if fake and batch > int(fake):
            raise RuntimeError(f"CUDA out of memory (TORCH_GPT2_FAKE_OOM_ABOVE={fake})")
        self.T, self.batch, self.device = T, batch, args.device
        torch.manual_seed(1337)
        self.model = Gpt(L, H, C, padded_vocab(V), T).to(args.device)
        self.opt, self.opt_kind = make_optimizer(self.model, args.device)
        self.params = [p for p in self.model.parameters()]
        self.fwd = torch.compile(self.model) if compiled else self.model
        g = torch.Generator(device=args.device).manual_seed(1)
        # A few batches of random tokens below the real vocabulary, on the device, reused in
        # turn: no input pipeline on either side's clock (meshtrain reads a token file).
        pool = torch.randint(0, V, (4, batch, T + 1), device=args.device, generator=g)
        self.data = [(pool[i, :, :-1].contiguous(), pool[i, :, 1:].contiguous()) for i in range(4)]
        self.clip = not args.no_clip
        self.i = 0

    def step(self):
        x, y = self.data[self.i % len(self.data)]
        self.i += 1
        with torch.autocast(device_type=self.device, dtype=torch.bfloat16):
            loss = self.fwd(x, y)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def close(self):
        self.model = self.fwd = self.opt = self.params = self.data = None


def fits(args, batch):
    """Two eager steps at `batch` (optimizer state included); False on out-of-memory."""
    run = None
    try:
        run = Run(args, batch, compiled=False)
        run.step()
        run.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        return True
    except Exception as e:  # noqa: BLE001 (only OOM is an answer; the rest re-raised)
        if not is_oom(e):
            raise
        return False
    finally:
        if run is not None:
            run.close()
        run = None
        free_memory(args.device)


def choose_batch(args):
    for b in args.batches:
        ok = fits(args, b)
        emit(kind="probe", shape=args.shape, batch=b, fits=ok)
        if ok:
            return b
    return None


def time_mode(args, mode, batch, peak_tflops):
    L, H, C, V, T = SHAPES[args.shape]
    Vp = padded_vocab(V)
    fpt, p_matmul = flops_per_token(L, C, 4 * C, Vp, T)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    run = Run(args, batch, compiled=(mode == "compile"))
    n_params = sum(p.numel() for p in run.model.parameters())
    # Warm-up: the first compile-mode step compiles (forward and backward graphs); timed
    # separately and reported as compile_s, never part of the step times.
    t0 = time.perf_counter()
    run.step()
    if args.device == "cuda":
        torch.cuda.synchronize()
    first_step_s = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        run.step()
    timer = Timer(args.device)
    losses = []
    timer.mark()
    for _ in range(args.steps):
        losses.append(run.step())
        timer.mark()
    ms = timer.intervals_ms()
    losses = [float(x) for x in losses]
    med = statistics.median(ms)
    tps = batch * T / (med * 1e-3)
    tps_mean = batch * T * len(ms) / (sum(ms) * 1e-3)
    row = dict(kind="result", shape=args.shape, mode=mode, batch=batch, seq=T, n_layer=L,
               n_head=H, d_model=C, vocab=V, padded_vocab=Vp, params=n_params,
               p_matmul=p_matmul, flops_per_token=fpt, steps=args.steps, warmup=args.warmup,
               step_ms_median=med, step_ms_min=min(ms), step_ms_max=max(ms),
               tokens_per_s=tps, tokens_per_s_mean=tps_mean,
               achieved_tflops=tps * fpt / 1e12,
               mfu_measured=(tps * fpt / (peak_tflops * 1e12)) if peak_tflops else None,
               mfu_nominal=tps * fpt / (args.nominal_tflops * 1e12),
               peak_tflops=peak_tflops, nominal_tflops=args.nominal_tflops,
               first_step_s=first_step_s, compile_s=first_step_s if mode == "compile" else None,
               loss_first=losses[0], loss_last=losses[-1], optimizer=run.opt_kind,
               sdpa=HAS_SDPA, clip=run.clip)
    if args.device == "cuda":
        row["max_mem_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
    run.close()
    del run
    free_memory(args.device)
    if not all(math.isfinite(x) for x in losses):
        raise RuntimeError(f"non-finite loss in {mode} mode: {losses}")
    return row


def main(argv=None):
    global OUT_FILE
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="124m")
    p.add_argument("--tiny", action="store_true", help="same as --shape tiny")
    p.add_argument("--mode", choices=["eager", "compile", "both"], default="both")
    p.add_argument("--batch", default="auto", help="microbatch (sequences), or auto")
    p.add_argument("--batches", default="64,32,16,8,4,2,1",
                   help="candidates for --batch auto, largest first")
    p.add_argument("--steps", type=int, default=20, help="timed steps (median)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (>= 1)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--peak-tflops", type=float, help="measured bf16 GEMM peak (skip measuring)")
    p.add_argument("--peak-n", type=int, help="GEMM size for the peak (default 8192; 512 on cpu)")
    p.add_argument("--peak-only", action="store_true", help="measure the GEMM peak, then exit")
    p.add_argument("--nominal-tflops", type=float, default=NOMINAL_TFLOPS)
    p.add_argument("--no-clip", action="store_true", help="no grad-norm clipping")
    p.add_argument("--out", help="also append the JSON lines to this file")
    args = p.parse_args(argv)
    OUT_FILE = args.out
    if args.tiny:
        args.shape = "tiny"
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be at least 1")
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        p.error(f"--batches {args.batches}: want a comma-separated list of integers")
    if args.device == "cuda" and not torch.cuda.is_available():
        emit(kind="error", error="CUDA is not available to torch " + torch.__version__)
        return 1

    dev_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    emit(kind="env", torch=torch.__version__, device=dev_name, sdpa=HAS_SDPA,
         compile=hasattr(torch, "compile"), cuda=torch.version.cuda,
         threads=torch.get_num_threads())

    peak = args.peak_tflops
    if peak is None:
        n = args.peak_n or (8192 if args.device == "cuda" else 512)
        peak, ms, best = measure_peak(args.device, n)
        emit(kind="peak", dtype="bf16", n=n, tflops=peak, ms_median=ms, ms_min=best,
             tflops_best=2.0 * n ** 3 / (best * 1e-3) / 1e12, device=dev_name)
    if args.peak_only:
        return 0

    if args.batch == "auto":
        batch = choose_batch(args)
        if batch is None:
            emit(kind="error", shape=args.shape, error=f"no batch of {args.batches} fits")
            return 1
    else:
        batch = int(args.batch)

    modes = ["eager", "compile"] if args.mode == "both" else [args.mode]
    failed = False
    for mode in modes:
        if mode == "compile" and not hasattr(torch, "compile"):
            emit(kind="skip", shape=args.shape, mode=mode,
                 reason=f"torch.compile does not exist in torch {torch.__version__}")
            continue
        try:
            emit(**time_mode(args, mode, batch, peak))
        except Exception as e:  # noqa: BLE001 (reported as a row; the next mode still runs)
            failed = True
            emit(kind="error", shape=args.shape, mode=mode, batch=batch,
                 error=f"{type(e).__name__}: {str(e)[:2000]}")
            free_memory(args.device)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
