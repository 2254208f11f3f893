#!/usr/bin/env python3
"""How much of a GEMM's burst rate (what `meshtrain calibrate --device cuda` and
torch_kernel_table.py time: ~2 ms batches after a warm-up) survives under sustained load, as
in a training run that keeps the GPU busy for hours: the clock falls to what the power limit
allows. Runs each shape for --seconds back to back, records the rate per second (CUDA
events) and the SM clock and power (nvidia-smi, read only), and prints the burst rate, the
rate of the last half and their ratio. Writes one JSON object (--out)."""
import argparse
import json
import subprocess
import sys
import time


def smi():
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
        clock, power, temp = (float(x) for x in out.strip().split(","))
        return {"sm_mhz": clock, "power_w": power, "temp_c": temp}
    except Exception as e:  # reported, not fatal
        return {"error": str(e)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--peak", type=float, default=989.4e12)
    a = ap.parse_args()
    import torch
    dev = torch.device("cuda")
    # Shapes of an 8B-class layer at 16K tokens (qkv, MLP in, MLP out) and the square.
    shapes = [(8192, 8192, 8192), (16384, 6144, 4096), (16384, 28672, 4096), (16384, 4096, 14336)]
    results = []
    for m, n, k in shapes:
        x = torch.rand(m, k, device=dev, dtype=torch.bfloat16) * 2 - 1
        w = torch.rand(n, k, device=dev, dtype=torch.bfloat16) * 2 - 1
        y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def batch(calls):
            s.record()
            for _ in range(calls):
                torch.matmul(x, w.t(), out=y)
            e.record()
            e.synchronize()
            return flops * calls / (s.elapsed_time(e) * 1e-3)

        # Let the card cool between shapes as calibrate's first shape finds it.
        time.sleep(5)
        batch(1)
        one = flops / batch(1)
        calls = max(1, int(2e-3 / one))
        burst = sorted(batch(calls) for _ in range(5))[2]
        per_s = max(1, int(1.0 / one))
        rates, clocks = [], []
        t0 = time.time()
        while time.time() - t0 < a.seconds:
            rates.append(batch(per_s))
            if len(rates) % 5 == 0:
                clocks.append(smi())
        tail = sorted(rates[len(rates) // 2:])
        sustained = tail[len(tail) // 2]
        r = {"m": m, "n": n, "k": k, "burst_flops_per_s": burst,
             "sustained_flops_per_s": sustained, "ratio": sustained / burst,
             "rates_per_s": rates, "smi": clocks}
        results.append(r)
        last = clocks[-1] if clocks else {}
        print(f"{m}x{n}x{k}: burst {burst / 1e12:.0f} TFLOP/s ({burst / a.peak:.3f}), sustained "
              f"(median of the last {len(tail)} s) {sustained / 1e12:.0f} ({sustained / a.peak:.3f}); "
              f"ratio {sustained / burst:.3f}; at the end {last}", file=sys.stderr)
        del x, w, y
    json.dump({"device": torch.cuda.get_device_name(0), "seconds": a.seconds, "shapes": results},
              open(a.out, "w"))


if __name__ == "__main__":
    main()
