#!/usr/bin/python3
"""Checks of bench/torch_gpt.py on its own: the PyTorch reference that meshtrain's
export/eval cross-check (tests/train/export_torch_test.cpp) compares against.

Run: /usr/bin/python3 tests/python/test_torch_gpt.py   (unittest; exit 0 when all pass)
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "torch_gpt.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import torch_gpt as tg  # noqa: E402

# The shape and weights the C++ cross-check uses for the make-weights direction.
TINY = {"n_layer": 2, "n_head": 4, "d_model": 64, "d_ff": 256, "vocab": 256, "seq_len": 64}
CROSS_STD, CROSS_PERTURB = 0.4, 0.3
# export_torch_test.cpp asserts |loss_meshtrain - loss_torch| <= 1e-5 * loss.
CROSS_REL_TOL = 1e-5


def reference_loss(w, cfg, tokens, batch, seq, batches):
    """GPT-2 mean cross-entropy in float64 numpy, written independently of the torch module
    (explicit per-head loops, hand-written LayerNorm/GELU/softmax)."""
    w = {k: v.double().numpy() for k, v in w.items()}
    d, nh = cfg["d_model"], cfg["n_head"]
    hd = d // nh

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * w[p + ".weight"] + w[p + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    losses = []
    for k in range(batches):
        chunk = tokens[k * batch * seq: (k + 1) * batch * seq + 1]
        for b in range(batch):
            inp = chunk[b * seq:(b + 1) * seq]
            tgt = chunk[b * seq + 1:(b + 1) * seq + 1]
            x = w["transformer.wte.weight"][inp] + w["transformer.wpe.weight"][:seq]
            for i in range(cfg["n_layer"]):
                p = f"transformer.h.{i}."
                h = ln(x, p + "ln_1")
                qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
                out = np.zeros((seq, d))
                for head in range(nh):
                    cols = slice(head * hd, (head + 1) * hd)
                    q = qkv[:, 0 * d:1 * d][:, cols]
                    kk = qkv[:, 1 * d:2 * d][:, cols]
                    v = qkv[:, 2 * d:3 * d][:, cols]
                    s = q @ kk.T / math.sqrt(hd)
                    s[np.triu_indices(seq, 1)] = -np.inf
                    s = np.exp(s - s.max(-1, keepdims=True))
                    out[:, cols] = (s / s.sum(-1, keepdims=True)) @ v
                x = x + out @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
                h = ln(x, p + "ln_2")
                h = gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
                x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
            logits = ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].T
            m = logits.max(-1, keepdims=True)
            lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
            losses.append(np.mean(lse - logits[np.arange(seq), tgt]))
    return float(np.mean(losses))


def run_script(*args):
    r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


class SafetensorsFormat(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "t.safetensors")

    def tearDown(self):
        self.dir.cleanup()

    def test_round_trip_exact(self):
        g = torch.Generator().manual_seed(1)
        tensors = {"a.weight": torch.randn(3, 5, generator=g), "b": torch.randn(7, generator=g),
                   "c": torch.tensor([1.5, -0.0, float("inf")]), "s": torch.randn(2, 1, 4)}
        tg.save_safetensors(self.path, tensors, {"n_layer": 2, "note": "x"})
        back, meta = tg.load_safetensors(self.path)
        self.assertEqual(meta, {"n_layer": "2", "note": "x"})
        self.assertEqual(set(back), set(tensors))
        for k in tensors:
            self.assertEqual(back[k].dtype, torch.float32)
            self.assertTrue(torch.equal(back[k], tensors[k]), k)

    def test_layout_follows_the_spec(self):
        tensors = {"z": torch.arange(6.).view(2, 3), "a": torch.ones(5)}
        tg.save_safetensors(self.path, tensors, {"vocab": "256"})
        with open(self.path, "rb") as f:
            raw = f.read()
        (n,) = struct.unpack("<Q", raw[:8])
        self.assertEqual((8 + n) % 8, 0, "data should start 8-byte aligned")
        header = json.loads(raw[8:8 + n])
        self.assertEqual(header.pop("__metadata__"), {"vocab": "256"})
        end = 0
        for name in sorted(header):  # back to back, in name order
            info = header[name]
            self.assertEqual(info["dtype"], "F32")
            self.assertEqual(info["data_offsets"][0], end)
            end = info["data_offsets"][1]
        self.assertEqual(8 + n + end, len(raw))
        z = header["z"]["data_offsets"]
        self.assertEqual(list(np.frombuffer(raw[8 + n + z[0]:8 + n + z[1]], "<f4")),
                         [0, 1, 2, 3, 4, 5])
        self.assertEqual(header["z"]["shape"], [2, 3])

    def test_reads_other_float_dtypes(self):
        vals = np.array([1.0, -2.5, 0.15625], dtype=np.float32)
        blobs = {"F64": vals.astype("<f8").tobytes(), "F16": vals.astype("<f2").tobytes(),
                 "BF16": (vals.view(np.uint32) >> 16).astype("<u2").tobytes()}
        header, data, off = {}, b"", 0
        for name, raw in blobs.items():
            header[name] = {"dtype": name, "shape": [3], "data_offsets": [off, off + len(raw)]}
            data, off = data + raw, off + len(raw)
        h = json.dumps(header).encode()
        with open(self.path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + data)
        back, meta = tg.load_safetensors(self.path)
        self.assertEqual(meta, {})
        for name in blobs:  # all three values are exact in every one of these dtypes
            self.assertEqual(back[name].tolist(), vals.tolist(), name)

    def test_rejects_truncated_file(self):
        tg.save_safetensors(self.path, {"a": torch.ones(100)})
        with open(self.path, "rb") as f:
            raw = f.read()
        with open(self.path, "wb") as f:
            f.write(raw[:-4])
        with self.assertRaises(tg.UsageError):
            tg.load_safetensors(self.path)


class Model(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.data = os.path.join(cls.dir.name, "tok.bin")
        cls.tokens = np.random.default_rng(7).integers(0, TINY["vocab"], 4000)
        tg.write_tokens(cls.data, cls.tokens)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def cross_model(self):
        return tg.Gpt(TINY).init_weights(3, std=CROSS_STD, perturb=CROSS_PERTURB)

    def test_names_and_shapes_are_hugging_face_gpt2(self):
        d, f, v, t = TINY["d_model"], TINY["d_ff"], TINY["vocab"], TINY["seq_len"]
        want = {"transformer.wte.weight": [v, d], "transformer.wpe.weight": [t, d],
                "transformer.ln_f.weight": [d], "transformer.ln_f.bias": [d]}
        for i in range(TINY["n_layer"]):
            p = f"transformer.h.{i}."
            want.update({p + "ln_1.weight": [d], p + "ln_1.bias": [d],
                         p + "attn.c_attn.weight": [d, 3 * d], p + "attn.c_attn.bias": [3 * d],
                         p + "attn.c_proj.weight": [d, d], p + "attn.c_proj.bias": [d],
                         p + "ln_2.weight": [d], p + "ln_2.bias": [d],
                         p + "mlp.c_fc.weight": [d, f], p + "mlp.c_fc.bias": [f],
                         p + "mlp.c_proj.weight": [f, d], p + "mlp.c_proj.bias": [d]})
        got = {k: list(v.shape) for k, v in tg.Gpt(TINY).state_dict().items()}
        self.assertEqual(got, want)

    def test_init_statistics(self):
        cfg = dict(TINY, n_layer=4, d_model=128, d_ff=512)
        sd = tg.Gpt(cfg).init_weights(1).state_dict()
        resid = 0.02 / math.sqrt(2 * 4)
        for k, v in sd.items():
            if k.endswith("c_proj.weight"):
                self.assertAlmostEqual(v.std().item(), resid, delta=0.05 * resid, msg=k)
            elif v.dim() == 2:
                self.assertAlmostEqual(v.std().item(), 0.02, delta=0.001, msg=k)
            elif ".ln_" in k and k.endswith(".weight"):
                self.assertTrue(torch.all(v == 1), k)
            else:
                self.assertTrue(torch.all(v == 0), k)

    def test_matches_independent_float64_reference(self):
        model = self.cross_model()
        got = tg.evaluate(model, self.tokens, 2, 32, 3)
        ref = reference_loss(model.state_dict(), TINY, self.tokens, 2, 32, 3)
        # f32 forward vs exact (f64): measured ~5e-8 relative; 1e-6 leaves 20x margin.
        self.assertLess(abs(got - ref), 1e-6 * ref, (got, ref))

    def test_float32_error_is_far_below_cross_check_tolerance(self):
        # Justifies CROSS_REL_TOL: each f32 implementation sits within ~1e-7 relative of the
        # exact loss, so two of them (different summation orders) differ by far less than 1e-5.
        model = self.cross_model()
        f32 = tg.evaluate(model, self.tokens, 2, 32, 3)
        f64 = tg.evaluate(self.cross_model(), self.tokens, 2, 32, 3, dtype=torch.float64)
        self.assertLess(abs(f32 - f64), 0.1 * CROSS_REL_TOL * f64, (f32, f64))

    def test_likely_mistakes_exceed_cross_check_tolerance(self):
        # The cross-check is only as good as its sensitivity: each plausible bug of an
        # implementation must move the loss by far more than the tolerance.
        base = self.cross_model()
        ref = tg.evaluate(base, self.tokens, 2, 32, 3)
        d, hd = TINY["d_model"], TINY["d_model"] // TINY["n_head"]

        def mutated(fn):
            m = self.cross_model()
            with torch.no_grad():
                fn(m.state_dict(keep_vars=True))
            return tg.evaluate(m, self.tokens, 2, 32, 3)

        def swap_qk(sd):
            w = sd["transformer.h.0.attn.c_attn.weight"]
            w[:, :2 * d] = torch.cat([w[:, d:2 * d], w[:, :d]], 1).clone()

        def swap_heads(sd):  # wrong head order in v only
            w = sd["transformer.h.0.attn.c_attn.weight"]
            a, b = slice(2 * d, 2 * d + hd), slice(2 * d + hd, 2 * d + 2 * hd)
            w[:, a], w[:, b] = w[:, b].clone(), w[:, a].clone()

        def transpose_proj(sd):  # Conv1D [in, out] read as nn.Linear [out, in]
            w = sd["transformer.h.1.attn.c_proj.weight"]
            w.copy_(w.t().clone())

        def drop_ln_bias(sd):
            sd["transformer.h.1.ln_2.bias"].zero_()

        def drop_ln_f_bias(sd):
            sd["transformer.ln_f.bias"].zero_()

        for name, fn in [("swap q/k", swap_qk), ("head order", swap_heads),
                         ("transposed c_proj", transpose_proj), ("ln_2 bias", drop_ln_bias),
                         ("ln_f bias", drop_ln_f_bias)]:
            with self.subTest(name):
                self.assertGreater(abs(mutated(fn) - ref), 100 * CROSS_REL_TOL * ref)

        # A model without the causal mask sees the future.
        class NoMask(tg.Attention):
            def forward(self, x):
                b, t, dd = x.shape
                q, k, v = self.c_attn(x).split(dd, dim=2)
                q, k, v = (z.view(b, t, self.n_head, hd).transpose(1, 2) for z in (q, k, v))
                att = (q @ k.transpose(-2, -1) / math.sqrt(hd)).softmax(-1)
                return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, dd))
        m = self.cross_model()
        for blk in m.transformer.h:
            blk.attn.__class__ = NoMask
        self.assertGreater(abs(tg.evaluate(m, self.tokens, 2, 32, 3) - ref),
                           100 * CROSS_REL_TOL * ref)

    def test_batches_are_consecutive_windows(self):
        model = self.cross_model()
        toks = self.tokens
        manual = []
        with torch.no_grad():
            for k in range(3):
                s = k * 2 * 32
                x = torch.from_numpy(toks[s:s + 64]).view(2, 32)
                y = torch.from_numpy(toks[s + 1:s + 65]).view(2, 32)
                manual.append(float(model(x, y)))
        self.assertAlmostEqual(tg.evaluate(model, toks, 2, 32, 3), sum(manual) / 3, places=6)

    def test_optimizer_groups(self):
        model = tg.Gpt(TINY)
        opt = tg.make_optimizer(model, 1e-3)
        for g in opt.param_groups:
            self.assertEqual(g["betas"], (0.9, 0.95))
            self.assertEqual(g["eps"], 1e-8)
            for p in g["params"]:
                self.assertEqual(g["weight_decay"], 0.1 if p.dim() == 2 else 0.0)
        self.assertEqual(sum(len(g["params"]) for g in opt.param_groups),
                         len(list(model.parameters())))


class Cli(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.data = os.path.join(self.dir.name, "tok.bin")
        tg.write_tokens(self.data, np.random.default_rng(5).integers(0, 256, 3000))
        self.w = os.path.join(self.dir.name, "w.safetensors")

    def tearDown(self):
        self.dir.cleanup()

    def test_make_weights_then_eval(self):
        rc, out, err = run_script("make-weights", "--n-layer", "2", "--n-head", "4",
                                  "--d-model", "64", "--d-ff", "256", "--vocab", "256",
                                  "--seq", "64", "--seed", "9", "--std", str(CROSS_STD),
                                  "--perturb", str(CROSS_PERTURB), "--out", self.w)
        self.assertEqual(rc, 0, err)
        tensors, meta = tg.load_safetensors(self.w)
        self.assertEqual(meta, {k: str(v) for k, v in TINY.items()})
        rc, out, err = run_script("eval", "--weights", self.w, "--data", self.data,
                                  "--batch", "2", "--seq", "32", "--batches", "3")
        self.assertEqual(rc, 0, err)
        lines = out.strip().splitlines()
        self.assertEqual(len(lines), 1, out)
        loss = json.loads(lines[0])["loss"]
        model = tg.model_from_safetensors(self.w)
        toks = tg.read_tokens(self.data)
        self.assertEqual(loss, tg.evaluate(model, toks, 2, 32, 3))
        ref = reference_loss(tensors, TINY, toks, 2, 32, 3)
        self.assertLess(abs(loss - ref), 1e-6 * ref)

    def test_eval_refuses_bad_input(self):
        run_script("make-weights", "--n-layer", "1", "--n-head", "2", "--d-model", "16",
                   "--vocab", "128", "--seq", "16", "--out", self.w)
        # tokens up to 255 but vocab 128
        rc, _, err = run_script("eval", "--weights", self.w, "--data", self.data,
                                "--batch", "1", "--seq", "16", "--batches", "1")
        self.assertEqual(rc, 2)
        self.assertIn("vocab", err)
        # too few tokens
        rc, _, err = run_script("eval", "--weights", self.w, "--data", self.data,
                                "--batch", "100", "--seq", "16", "--batches", "2")
        self.assertEqual(rc, 2)
        self.assertIn("tokens", err)

    def test_train_reports_tokens_per_s(self):
        rc, out, err = run_script("train", "--n-layer", "1", "--n-head", "2", "--d-model", "32",
                                  "--vocab", "256", "--seq", "32", "--batch", "2",
                                  "--steps", "4", "--data", self.data, "--threads", "1")
        self.assertEqual(rc, 0, err)
        last = json.loads(out.strip().splitlines()[-1])
        self.assertGreater(last["tokens_per_s"], 0)
        steps = [json.loads(s) for s in err.strip().splitlines()]
        self.assertEqual([s["step"] for s in steps], [0, 1, 2, 3])
        # first loss of a fresh GPT-2 init is close to ln(vocab)
        self.assertLess(abs(steps[0]["loss"] - math.log(256)), 0.1)

    def test_train_bf16_runs_under_autocast(self):
        # The benchmark's bf16 peer: the same steps under torch.autocast, reported as bf16,
        # with a loss that is still about ln(vocab) at the start (bf16 GEMMs, f32 loss).
        rc, out, err = run_script("train", "--n-layer", "1", "--n-head", "2", "--d-model", "32",
                                  "--vocab", "256", "--seq", "32", "--batch", "2",
                                  "--steps", "3", "--data", self.data, "--threads", "1",
                                  "--dtype", "bf16")
        self.assertEqual(rc, 0, err)
        last = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(last["dtype"], "bf16")
        steps = [json.loads(s) for s in err.strip().splitlines()]
        self.assertLess(abs(steps[0]["loss"] - math.log(256)), 0.1)

    def test_bf16_probe_reports_the_autocast_matmul(self):
        rc, out, err = run_script("bf16-probe")
        self.assertEqual(rc, 0, err)
        probe = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(probe["dtype"], "torch.bfloat16")  # autocast did give bf16
        self.assertGreater(probe["gflops"], 0)
        self.assertIn("mkldnn", probe)


if __name__ == "__main__":
    unittest.main(verbosity=1)
