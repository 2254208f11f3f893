#!/usr/bin/env python3
"""Helpers of bench/gpu/run.sh (no torch needed).

  report.py meshtrain-row METRICS.jsonl --shape 124m --batch B --peak-tflops X [--warmup 5]
      reads meshtrain's per-step metrics (src/train/trainer.cpp: step, loss, tokens_per_s,
      time_s, mfu, ...), drops the first --warmup steps, and prints one JSON row
      (kind "meshtrain") with the median step time, tokens/s and MFU by meshtrain's formula
      against the measured peak and the nominal 989 TFLOP/s.
  report.py table BENCH.jsonl [--md OUT.md] [--device NAME] [--commit C]
      the comparison table (markdown) from the rows run.sh collected; also writes the BENCH.md
      fragment with --md.
  report.py profile LOG
      the `--profile` block of a meshtrain train log.
"""

import argparse
import json
import math
import statistics
import sys

NOMINAL_TFLOPS = 989.0
VOCAB_PAD_MULTIPLE = 128
# name -> (n_layer, n_head, d_model, vocab, seq), as bench/gpu/torch_gpt2.py and meshtrain's
# presets gpt2-124m / gpt2-350m
SHAPES = {
    "124m": (12, 12, 768, 50257, 1024),
    "350m": (24, 16, 1024, 50257, 1024),
    "tiny": (2, 4, 64, 500, 64),
}
GOAL_EAGER = 1.2
GOAL_COMPILE = 1.0


def flops_per_token(shape):
    L, _, C, V, T = SHAPES[shape]
    Vp = (V + VOCAB_PAD_MULTIPLE - 1) // VOCAB_PAD_MULTIPLE * VOCAB_PAD_MULTIPLE
    F = 4 * C
    return 6.0 * (L * (4 * C * C + 2 * C * F) + Vp * C) + 12.0 * L * C * T


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def cmd_meshtrain_row(a):
    steps = sorted(read_jsonl(a.metrics), key=lambda r: r["step"])
    timed = steps[a.warmup:]
    if not timed:
        sys.exit(f"{a.metrics}: {len(steps)} steps; need more than --warmup {a.warmup}")
    T = SHAPES[a.shape][4]
    med = statistics.median(r["time_s"] for r in timed)
    tps = a.batch * T / med
    fpt = flops_per_token(a.shape)
    losses = [r["loss"] for r in steps]
    row = dict(kind="meshtrain", shape=a.shape, batch=a.batch, seq=T, steps=len(steps),
               warmup=a.warmup, step_ms_median=1000 * med,
               step_ms_min=1000 * min(r["time_s"] for r in timed),
               step_ms_max=1000 * max(r["time_s"] for r in timed),
               tokens_per_s=tps,
               tokens_per_s_mean=a.batch * T * len(timed) / sum(r["time_s"] for r in timed),
               flops_per_token=fpt, achieved_tflops=tps * fpt / 1e12,
               mfu_measured=tps * fpt / (a.peak_tflops * 1e12) if a.peak_tflops else None,
               mfu_nominal=tps * fpt / (NOMINAL_TFLOPS * 1e12),
               mfu_reported_by_meshtrain=statistics.median(r["mfu"] for r in timed),
               loss_first=losses[0], loss_last=losses[-1],
               peak_bytes=max(r.get("peak_bytes", 0) for r in steps),
               finite=all(math.isfinite(x) for x in losses))
    print(json.dumps(row))


def fmt_tps(x):
    return "-" if x is None else f"{x:,.0f}"


def fmt_ratio(a, b, goal):
    if a is None or b is None or b == 0:
        return "-"
    r = a / b
    return f"**{r:.2f}x**" + (" ✓" if r >= goal else " ✗")


def spread_notes(rows):
    """Per run: the median step time with its spread (min - max over the timed steps), and
    the peak memory, so that a ratio can be read against the noise of each side."""
    out = []
    for r in rows:
        if r.get("kind") not in ("meshtrain", "result") or r.get("step_ms_median") is None:
            continue
        who = "meshtrain" if r["kind"] == "meshtrain" else f"torch {r.get('mode')}"
        mem = r.get("max_mem_gib")
        if mem is None and r.get("peak_bytes"):
            mem = r["peak_bytes"] / 2**30
        out.append(f"{r['shape']}: {who}, batch {r['batch']}: step {r['step_ms_median']:.1f} ms "
                   f"median ({r['step_ms_min']:.1f} - {r['step_ms_max']:.1f} over "
                   f"{r['steps'] - r['warmup']} timed steps)"
                   + (f", peak memory {mem:.1f} GiB" if mem is not None else ""))
    return out


def cmd_spread(a):
    for n in spread_notes(read_jsonl(a.jsonl)):
        print(f"- {n}")


def table(rows):
    """Markdown lines: one row per (shape, meshtrain batch)."""
    peak_row = next((r for r in rows if r.get("kind") == "peak"), None)
    peak = peak_row["tflops"] if peak_row else None
    torch = {}
    for r in rows:
        if r.get("kind") == "result":
            torch[(r["shape"], r["batch"], r["mode"])] = r
    out = ["| shape | batch | meshtrain tok/s | MFU (measured peak / nominal) | torch eager tok/s "
           "| torch compile tok/s | vs eager (goal ≥ 1.2) | vs compile (goal ≥ 1.0) |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    shapes = []
    for r in rows:
        if r.get("shape") and r["shape"] not in shapes and r.get("kind") in (
                "meshtrain", "result", "meshtrain-error"):
            shapes.append(r["shape"])
    notes = []
    for s in shapes:
        mts = [r for r in rows if r.get("kind") == "meshtrain" and r["shape"] == s]
        batches = [r["batch"] for r in mts] or sorted(
            {b for (sh, b, _) in torch if sh == s}, reverse=True)[:1]
        for b in batches:
            mt = next((r for r in mts if r["batch"] == b), None)
            e = torch.get((s, b, "eager"))
            c = torch.get((s, b, "compile"))
            mt_tps = mt["tokens_per_s"] if mt else None
            mfu = "-"
            if mt:
                m = mt.get("mfu_measured")
                mfu = (f"{100 * m:.1f}%" if m is not None else "-") + \
                    f" / {100 * mt['mfu_nominal']:.1f}%"
            out.append(f"| {s} | {b} | {fmt_tps(mt_tps)} | {mfu} "
                       f"| {fmt_tps(e['tokens_per_s'] if e else None)} "
                       f"| {fmt_tps(c['tokens_per_s'] if c else None)} "
                       f"| {fmt_ratio(mt_tps, e['tokens_per_s'] if e else None, GOAL_EAGER)} "
                       f"| {fmt_ratio(mt_tps, c['tokens_per_s'] if c else None, GOAL_COMPILE)} |")
        # torch at a larger batch than meshtrain could fit: a note, not a row
        for (sh, b, mode), r in sorted(torch.items()):
            if sh == s and b not in batches:
                notes.append(f"{s}: torch {mode} at batch {b} (largest that fits for torch): "
                             f"{fmt_tps(r['tokens_per_s'])} tok/s, MFU "
                             f"{100 * (r.get('mfu_measured') or 0):.1f}% of measured peak")
        for r in rows:
            if r.get("shape") == s and r.get("kind") in ("error", "meshtrain-error", "skip"):
                what = r.get("error") or r.get("reason") or ""
                mode = f" ({r['mode']})" if r.get("mode") else ""
                notes.append(f"{s}: {r.get('kind')}{mode}, batch {r.get('batch', '?')}: "
                             f"{str(what)[:160]}")
    notes += spread_notes(rows)
    for r in rows:
        if r.get("kind") == "result" and r.get("mode") == "compile" and r.get("compile_s"):
            notes.append(f"{r['shape']}: torch.compile warm-up (first step, not timed) "
                         f"{r['compile_s']:.0f} s at batch {r['batch']}")
    return out, notes, peak_row


def cmd_table(a):
    rows = read_jsonl(a.jsonl)
    lines, notes, peak_row = table(rows)
    peak = peak_row["tflops"] if peak_row else None
    env = next((r for r in rows if r.get("kind") == "env"), {})
    print("\n".join(lines))
    for n in notes:
        print(f"- {n}")
    if not a.md:
        return
    device = a.device or env.get("device", "?")
    with open(a.md, "w") as f:
        f.write("## GPU: meshtrain vs PyTorch, GPT-2 124M / 350M training (bf16)\n\n")
        f.write(f"Command: `scripts/device-run.sh bench` (bench/gpu/run.sh; meshtrain "
                f"{a.commit or '?'}), {a.date or ''}\n\n")
        f.write(f"Device: {device}; PyTorch {env.get('torch', '?')} (CUDA "
                f"{env.get('cuda', '?')}). bf16 GEMM peak measured in the same run: "
                f"{peak:.0f} TFLOP/s (median of {peak_row.get('n', '?')}³ bf16 matmuls, random "
                f"data); "
                f"nominal {NOMINAL_TFLOPS:.0f} TFLOP/s.\n\n" if peak else
                f"Device: {device}; PyTorch {env.get('torch', '?')}.\n\n")
        f.write("Both sides: seq 1024, vocab 50257 padded to 50304, tied embeddings, tanh GELU, "
                "LayerNorm with bias, no dropout, bf16 GEMMs over fp32 master weights, AdamW "
                "(0.9, 0.95) with weight decay 0.1, grad clip 1.0, random tokens. PyTorch: "
                "`torch.autocast(bf16)`, `F.scaled_dot_product_attention(is_causal=True)`, "
                "`AdamW(fused=True)`; compile = `torch.compile(model)` (default mode; the "
                "compile is warm-up). Tokens/s = batch × 1024 / median step time after "
                "warm-up (CUDA events for PyTorch; meshtrain's per-step `time_s`). MFU = "
                "tokens/s × meshtrain's FLOPs per token (6·P_matmul + 12·L·C·T, "
                "docs/flops.md) / peak. Batch: the largest of 64, 32, 16, ... that fits "
                "meshtrain (PyTorch runs the same batch; its own largest is noted).\n\n")
        f.write("\n".join(lines) + "\n")
        if notes:
            f.write("\n" + "\n".join(f"- {n}" for n in notes) + "\n")
        if a.profile and a.profile.strip():
            f.write("\nmeshtrain `--profile` (host-side scopes; see docs/cuda-device-session.md "
                    "on what they mean for asynchronous kernels):\n\n```\n"
                    + a.profile.strip() + "\n```\n")


def cmd_profile(a):
    with open(a.log, errors="replace") as f:
        lines = f.read().splitlines()
    keep = False
    for line in lines:
        if line.startswith("profile over"):
            keep = True
        elif keep and not line.startswith("  "):
            keep = False
        if keep:
            print(line)


def main(argv=None):
    p = argparse.ArgumentParser(description="helpers of bench/gpu/run.sh")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("meshtrain-row")
    m.add_argument("metrics")
    m.add_argument("--shape", choices=sorted(SHAPES), required=True)
    m.add_argument("--batch", type=int, required=True)
    m.add_argument("--peak-tflops", type=float)
    m.add_argument("--warmup", type=int, default=5)
    t = sub.add_parser("table")
    t.add_argument("jsonl")
    t.add_argument("--md")
    t.add_argument("--device")
    t.add_argument("--commit")
    t.add_argument("--date")
    t.add_argument("--profile", help="text of meshtrain's --profile block")
    pr = sub.add_parser("profile")
    pr.add_argument("log")
    sp = sub.add_parser("spread", help="median step times with their spread, peak memory")
    sp.add_argument("jsonl")
    a = p.parse_args(argv)
    {"meshtrain-row": cmd_meshtrain_row, "table": cmd_table, "profile": cmd_profile,
     "spread": cmd_spread}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
