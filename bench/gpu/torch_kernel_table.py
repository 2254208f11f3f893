#!/usr/bin/env python3
"""The kernel costs PyTorch (what Megatron-style runs call) reaches on this GPU, on the grid
`meshtrain calibrate --device cuda` measures: bf16 GEMM efficiency by (m, n, k) with bf16
output (cuBLAS through torch.matmul), causal scaled-dot-product attention at head dim 128 by
sequence length (forward and backward, FLOPs counted as the published kernel tables count
them), and an elementwise add's bandwidth. Writes one JSON object (--out) that
scripts/gpu_table_to_cluster.py reads beside meshtrain's cluster file.

Timing: CUDA events around a batch of back-to-back calls sized to ~2 ms, median of --reps
batches, after a warm-up; random data (never zeros)."""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peak", type=float, default=989.4e12,
                    help="the data sheet's dense bf16 peak the efficiencies are fractions of")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False

    def per_call(fn):
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def timed(calls):
            s.record()
            for _ in range(calls):
                fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e) * 1e-3 / calls

        one = max(1e-7, timed(1))
        calls = int(min(1000, max(1, 2e-3 / one)))
        t = sorted(timed(calls) for _ in range(a.reps))
        return t[len(t) // 2]

    grid = [256, 1024, 4096] if a.quick else [64 * 2**i for i in range(10)]
    big = max(grid)
    # One flat buffer each, viewed as contiguous [m, k], [n, k], [m, n] (as a layer's tensors).
    A = torch.rand(big * big, device=dev, dtype=torch.bfloat16) * 2 - 1
    B = torch.rand(big * big, device=dev, dtype=torch.bfloat16) * 2 - 1
    C = torch.empty(big * big, device=dev, dtype=torch.bfloat16)
    eff = []
    for m in grid:
        for n in grid:
            for k in grid:
                x, w, y = A[: m * k].view(m, k), B[: n * k].view(n, k), C[: m * n].view(m, n)
                sec = per_call(lambda: torch.matmul(x, w.t(), out=y))
                eff.append(min(1.0, 2.0 * m * n * k / sec / a.peak))
    # The backward's layouts beside the forward's on a subset: dgrad is A[m, k] B[k, n] (NN),
    # wgrad A[k, m]^T B[k, n] (TN); the table is NT. Their rate over NT's, per shape.
    layouts = []
    sub = [(m, n, k) for m in grid[2::3] for n in grid[2::3] for k in grid[2::3]]
    for m, n, k in sub:
        y = C[: m * n].view(m, n)
        nt = per_call(lambda: torch.matmul(A[: m * k].view(m, k), B[: n * k].view(n, k).t(), out=y))
        nn = per_call(lambda: torch.matmul(A[: m * k].view(m, k), B[: k * n].view(k, n), out=y))
        tn = per_call(lambda: torch.matmul(A[: k * m].view(k, m).t(), B[: k * n].view(k, n), out=y))
        layouts.append({"m": m, "n": n, "k": k, "nn_over_nt": nt / nn, "tn_over_nt": nt / tn})
    r_nn = sorted(x["nn_over_nt"] for x in layouts)
    r_tn = sorted(x["tn_over_nt"] for x in layouts)
    print(f"layouts over {len(sub)} shapes: NN/NT median {r_nn[len(r_nn) // 2]:.3f} "
          f"({r_nn[0]:.2f}..{r_nn[-1]:.2f}), TN/NT median {r_tn[len(r_tn) // 2]:.3f} "
          f"({r_tn[0]:.2f}..{r_tn[-1]:.2f})", file=sys.stderr)
    del A, B, C
    if 8192 in grid:
        i = grid.index(8192)
        print(f"gemm table: {len(eff)} shapes; 8192^3 at "
              f"{eff[(i * len(grid) + i) * len(grid) + i]:.3f} of the peak", file=sys.stderr)

    hd, heads = 128, 16
    att = {"head_dim": hd, "seq": [], "fwd_flops_per_s": [], "bwd_flops_per_s": [], "backend": ""}
    for T in [512, 1024, 2048, 4096, 8192, 16384][: 2 if a.quick else 6]:
        Bn = max(1, 16384 // T)
        q, k, v = (torch.randn(Bn, heads, T, hd, device=dev, dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        do = torch.randn(Bn, heads, T, hd, device=dev, dtype=torch.bfloat16)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        fwd = per_call(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

        def fwd_bwd():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(do)
        both = per_call(fwd_bwd)
        flops = 4.0 * Bn * heads * T * T * hd / 2
        att["seq"].append(T)
        att["fwd_flops_per_s"].append(flops / fwd)
        att["bwd_flops_per_s"].append(2.5 * flops / max(1e-9, both - fwd))
        print(f"sdpa T {T}: fwd {flops / fwd / 1e12:.0f} TFLOP/s, "
              f"bwd {2.5 * flops / (both - fwd) / 1e12:.0f} TFLOP/s", file=sys.stderr)
        del q, k, v, do, o
    att["backend"] = "torch.nn.functional.scaled_dot_product_attention (default backend choice)"

    n = (1 << 28) if not a.quick else (1 << 24)
    x = torch.rand(n, device=dev) * 2 - 1
    y = torch.rand(n, device=dev) * 2 - 1
    z = torch.empty(n, device=dev)
    add_bw = 3 * 4 * n / per_call(lambda: torch.add(x, y, out=z))
    copy_bw = 2 * 4 * n / per_call(lambda: z.copy_(x))
    json.dump({
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "peak_flops_bf16": a.peak,
        "gemm_table": {"dtype": "bf16", "output": "bf16", "m": grid, "n": grid, "k": grid,
                       "efficiency": eff},
        "layouts": layouts,
        "attention": att,
        "add_bytes_per_s": add_bw,
        "copy_bytes_per_s": copy_bw,
    }, open(a.out, "w"))
    print(f"add {add_bw / 1e12:.2f} TB/s, copy {copy_bw / 1e12:.2f} TB/s; wrote {a.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
