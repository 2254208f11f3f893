#!/usr/bin/python3
"""Checks of the GPU benchmark's Python parts that run without a GPU: bench/gpu/torch_gpt2.py
on the CPU (tiny shape) and bench/gpu/report.py.

Run: /usr/bin/python3 tests/python/test_gpu_bench.py   (unittest; exit 0 when all pass)
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
GPU = os.path.join(HERE, "..", "..", "bench", "gpu")
TORCH_GPT2 = os.path.join(GPU, "torch_gpt2.py")
REPORT = os.path.join(GPU, "report.py")
sys.path.insert(0, GPU)
import report  # noqa: E402
import torch_gpt2  # noqa: E402


def run_json(args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([sys.executable] + args, capture_output=True, text=True, env=e,
                       timeout=300)
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    return p.returncode, rows, p.stderr


class Flops(unittest.TestCase):
    def test_meshtrain_formula(self):
        # docs/flops.md: 6 * P_matmul + 12 * L * C * T, Vp = 50304 (meshtrain pads to 128)
        self.assertEqual(torch_gpt2.padded_vocab(50257), 50304)
        self.assertEqual(report.flops_per_token("124m"), 854654976.0)
        self.assertEqual(report.flops_per_token("350m"), 2422996992.0)
        for name, (L, _, C, V, T) in torch_gpt2.SHAPES.items():
            f, _ = torch_gpt2.flops_per_token(L, C, 4 * C, torch_gpt2.padded_vocab(V), T)
            self.assertEqual(f, report.flops_per_token(name), name)
        self.assertEqual(torch_gpt2.SHAPES, report.SHAPES)


class TorchPeerOnCpu(unittest.TestCase):
    def test_tiny_both_modes(self):
        rc, rows, err = run_json([TORCH_GPT2, "--device", "cpu", "--tiny", "--mode", "both",
                                  "--batch", "2", "--steps", "2", "--warmup", "1",
                                  "--peak-tflops", "0.5"])
        self.assertEqual(rc, 0, err)
        res = [r for r in rows if r["kind"] == "result"]
        self.assertEqual(len(res), 1 if not hasattr(torch_gpt2.torch, "compile") else 2)
        r = res[0]
        self.assertEqual((r["mode"], r["batch"], r["seq"]), ("eager", 2, 64))
        self.assertGreater(r["tokens_per_s"], 0)
        self.assertAlmostEqual(r["tokens_per_s"], 2 * 64 / (r["step_ms_median"] * 1e-3))
        self.assertAlmostEqual(r["mfu_measured"],
                               r["tokens_per_s"] * r["flops_per_token"] / 0.5e12)
        self.assertEqual(r["flops_per_token"], report.flops_per_token("tiny"))
        if not hasattr(torch_gpt2.torch, "compile"):
            self.assertTrue(any(x["kind"] == "skip" and x["mode"] == "compile" for x in rows))

    def test_batch_search_and_peak(self):
        rc, rows, err = run_json([TORCH_GPT2, "--device", "cpu", "--tiny", "--mode", "eager",
                                  "--batches", "16,8,4,2", "--steps", "1", "--warmup", "1",
                                  "--peak-n", "128"],
                                 env={"TORCH_GPT2_FAKE_OOM_ABOVE": "4"})
        self.assertEqual(rc, 0, err)
        probes = [(r["batch"], r["fits"]) for r in rows if r["kind"] == "probe"]
        self.assertEqual(probes, [(16, False), (8, False), (4, True)])
        peak = next(r for r in rows if r["kind"] == "peak")
        self.assertGreater(peak["tflops"], 0)
        res = next(r for r in rows if r["kind"] == "result")
        self.assertEqual(res["batch"], 4)
        self.assertEqual(res["peak_tflops"], peak["tflops"])

    def test_no_cuda_is_an_error(self):
        if torch_gpt2.torch.cuda.is_available():
            self.skipTest("this machine has CUDA")
        rc, rows, _ = run_json([TORCH_GPT2, "--tiny"])
        self.assertEqual(rc, 1)
        self.assertEqual(rows[-1]["kind"], "error")


class Report(unittest.TestCase):
    def test_meshtrain_row_and_table(self):
        with tempfile.TemporaryDirectory() as d:
            m = os.path.join(d, "m.jsonl")
            with open(m, "w") as f:  # 7 steps: 2 warm-up, then 0.10 0.20 0.10 0.30 0.10
                for i, t in enumerate([5.0, 1.0, 0.1, 0.2, 0.1, 0.3, 0.1]):
                    f.write(json.dumps({"step": i + 1, "loss": 10.0 - i, "time_s": t,
                                        "tokens_per_s": 8 * 1024 / t, "mfu": 0.5}) + "\n")
            p = subprocess.run([sys.executable, REPORT, "meshtrain-row", m, "--shape", "124m",
                                "--batch", "8", "--warmup", "2", "--peak-tflops", "800"],
                               capture_output=True, text=True, check=True)
            row = json.loads(p.stdout)
            self.assertAlmostEqual(row["step_ms_median"], 100.0)
            self.assertAlmostEqual(row["tokens_per_s"], 8 * 1024 / 0.1)
            self.assertAlmostEqual(row["mfu_measured"], 81920 * 854654976.0 / 800e12)
            self.assertAlmostEqual(row["mfu_nominal"], 81920 * 854654976.0 / 989e12)
            self.assertEqual((row["loss_first"], row["loss_last"]), (10.0, 4.0))
            rows = [{"kind": "peak", "tflops": 800.0, "n": 8192}, row,
                    {"kind": "result", "shape": "124m", "mode": "eager", "batch": 8,
                     "tokens_per_s": 81920 / 1.25},
                    {"kind": "result", "shape": "124m", "mode": "compile", "batch": 8,
                     "tokens_per_s": 81920 / 0.8, "compile_s": 40.0},
                    {"kind": "result", "shape": "124m", "mode": "eager", "batch": 16,
                     "tokens_per_s": 70000.0, "mfu_measured": 0.07}]
            lines, notes, _ = report.table(rows)
            self.assertEqual(len(lines), 3)
            self.assertIn("| 124m | 8 | 81,920 |", lines[2])
            self.assertIn("**1.25x** ✓", lines[2])   # vs eager, goal 1.2
            self.assertIn("**0.80x** ✗", lines[2])   # vs compile, goal 1.0
            self.assertTrue(any("batch 16" in n for n in notes))


if __name__ == "__main__":
    unittest.main()
