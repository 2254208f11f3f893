#!/usr/bin/env python3
"""What a Megatron-Core MoE layer's kernels reach on this GPU beyond the plain GEMM table
(issue 30: the planner is 8-15% optimistic on NVIDIA's Grok-1 recipe, and nothing published
splits an MoE layer's time on an H100; docs/planner.md "Published MoE and CP runs").

For each shape (the experts one rank holds and the rows each receives, as the planner's
plan/kernels.cpp moe_gemms sizes them for the rows of tests/plan/published_runs.json):
  * the experts' GEMMs as Transformer Engine's GroupedLinear runs them without CUTLASS: one
    cuBLAS GEMM per expert, back to back (`loop`) and each on its own stream (`streams`,
    TE's multi-stream cuBLAS), and torch._grouped_mm where this torch has it (`grouped`);
  * one dense GEMM of the same FLOPs ([E·rows, K] x [K, N]: what the planner's table would say
    for a single GEMM of that size), so each is also a ratio to it;
  * the token permutation: gathering n·k routed rows of width C in expert order
    (index_select) and combining them back weighted by their gates (index_add_), as bytes
    moved per second.
Efficiencies are fractions of --peak (the data sheet's dense bf16 rate). Timing: CUDA events
around a batch of back-to-back calls sized to ~2 ms, median of --reps batches after a
warm-up; random data. `--device cpu --quick` runs the same code small, to check it here.

Writes one JSON object (--out)."""
import argparse
import json
import statistics
import sys
import time

# (name, local experts, rows per expert, C (d_model), expert width per rank (after expert tp),
#  GLU: the first GEMM is 2x wide)
SHAPES = [
    ("grok1 8 GPUs: ep 2, etp 4", 4, 2048, 6144, 8192, True),
    ("grok1 64+ GPUs: ep 8, etp 4, cp 2", 1, 4096, 6144, 8192, True),
    ("mixtral-8x7b: ep 8, etp 1", 1, 4096, 4096, 14336, True),
    ("mixtral-8x7b: ep 2, etp 4", 4, 2048, 4096, 3584, True),
    ("qwen3-30b-a3b: ep 8, etp 1", 16, 2048, 2048, 768, True),
]
QUICK = [("quick", 2, 64, 128, 256, True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peak", type=float, default=989.4e12)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    import torch

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dt = torch.bfloat16

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def per_call(fn):
        fn()
        sync()

        def timed(calls):
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(calls):
                    fn()
                e.record()
                e.synchronize()
                return s.elapsed_time(e) / 1e3
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            return time.perf_counter() - t

        one = max(timed(1), 1e-6)
        calls = max(1, min(1000, int(2e-3 / one)))
        timed(calls)  # warm-up
        return statistics.median(timed(calls) / calls for _ in range(a.reps))

    rows_out = []
    for name, E, rows, C, F, glu in (QUICK if a.quick else SHAPES):
        n_in = (2 if glu else 1) * F
        x = torch.randn(E * rows, C, device=dev, dtype=dt)
        w1 = torch.randn(E, C, n_in, device=dev, dtype=dt) / C**0.5
        h = torch.randn(E * rows, F, device=dev, dtype=dt)
        w2 = torch.randn(E, F, C, device=dev, dtype=dt) / F**0.5
        xs, hs = list(x.split(rows)), list(h.split(rows))
        streams = [torch.cuda.Stream() for _ in range(E)] if cuda else []
        rec = {"shape": name, "experts": E, "rows_per_expert": rows, "C": C, "F": F, "glu": glu}
        for gemm, inp, parts, w, n_out, k in (("fc1", x, xs, w1, n_in, C), ("fc2", h, hs, w2, C, F)):
            flops = 2.0 * E * rows * n_out * k

            def loop():
                for e in range(E):
                    torch.matmul(parts[e], w[e])

            def on_streams():
                cur = torch.cuda.current_stream()
                for e in range(E):
                    streams[e].wait_stream(cur)
                    with torch.cuda.stream(streams[e]):
                        torch.matmul(parts[e], w[e])
                for s in streams:
                    cur.wait_stream(s)

            dense_w = w.reshape(E * k, n_out)[:k] if E > 1 else w[0]

            def dense():
                torch.matmul(inp, dense_w)

            r = {"flops": flops}
            r["loop_eff"] = flops / per_call(loop) / a.peak
            r["dense_eff"] = flops / per_call(dense) / a.peak
            if cuda:
                r["streams_eff"] = flops / per_call(on_streams) / a.peak
            if cuda and hasattr(torch, "_grouped_mm"):
                offs = torch.arange(rows, E * rows + 1, rows, device=dev, dtype=torch.int32)
                try:
                    r["grouped_eff"] = flops / per_call(
                        lambda: torch._grouped_mm(inp, w, offs=offs)) / a.peak
                except Exception as ex:  # an older or newer signature: say so, go on
                    r["grouped_error"] = str(ex)[:200]
            rec[gemm] = r
        # The permutation: n·k routed rows of C gathered in expert order, and combined back.
        n_tokens = E * rows // 2  # top 2: the rows come from half as many tokens
        tokens = torch.randn(n_tokens, C, device=dev, dtype=dt)
        idx = torch.randperm(E * rows, device=dev) % n_tokens
        gates = torch.rand(E * rows, 1, device=dev, dtype=dt)
        routed = torch.randn(E * rows, C, device=dev, dtype=dt)
        out = torch.zeros(n_tokens, C, device=dev, dtype=dt)
        row_bytes = 2.0 * C
        t_gather = per_call(lambda: tokens.index_select(0, idx))
        t_combine = per_call(lambda: out.index_add_(0, idx, routed * gates))
        rec["permute_bytes_per_s"] = 2 * E * rows * row_bytes / t_gather  # read + write
        # read the routed rows and gates, write their product, read it, read-add-write out
        rec["combine_bytes_per_s"] = (3 * E * rows + 2 * n_tokens) * row_bytes / t_combine
        rows_out.append(rec)
        print(json.dumps(rec), flush=True)

    meta = {"torch": torch.__version__, "device": a.device, "peak": a.peak}
    if cuda:
        meta["gpu"] = torch.cuda.get_device_name()
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "shapes": rows_out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
