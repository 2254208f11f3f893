#!/usr/bin/python3
"""PyTorch peer of meshtrain's GPT-2: the reference for cross-checks and the benchmark peer.

The model mirrors meshtrain exactly (Hugging Face GPT-2 names, Conv1D weights stored
[in, out], pre-LN blocks, LayerNorm eps 1e-5, tanh GELU, causal attention, tied LM head,
mean cross-entropy). Safetensors are read and written here without the `safetensors`
package.

Modes (run with Debian's /usr/bin/python3, which has torch 1.13):
  train         train on an llm.c token file; last stdout line is JSON with tokens_per_s
  eval          loss of a safetensors model on an llm.c token file; one JSON line {"loss": ...}
  make-weights  write a randomly initialised GPT-2 as safetensors (with shape metadata)
  blas-coretype measure OpenBLAS's kernels per OPENBLAS_CORETYPE, print the fastest
  bf16-probe    measure the bf16 matmul torch.autocast runs (oneDNN), 1 thread, and say
                which CPU kernels this PyTorch was built to use

Exit codes: 0 success, 1 failure while running, 2 bad input or usage.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

LN_EPS = 1e-5
DATA_MAGIC = 20240520
DATA_VERSION = 1
DATA_HEADER_INTS = 256
META_KEYS = ("n_layer", "n_head", "d_model", "d_ff", "vocab", "seq_len")


class UsageError(Exception):
    """Bad input found before any work (exit code 2)."""


# ----------------------------------------------------------------------------------------
# safetensors

_ST_DTYPES = {  # safetensors dtype -> (numpy dtype read from the file, bytes per element)
    "F32": (np.dtype("<f4"), 4),
    "F64": (np.dtype("<f8"), 8),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),  # widened to f32 by hand below
}


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} as F32 safetensors; metadata is {str: str}.

    Tensors are laid out in name order, back to back; the JSON header is padded with
    spaces to a multiple of 8 bytes so the data starts aligned. Written to a temporary
    name and renamed, so a reader never sees half a file.
    """
    names = sorted(tensors)
    header = {}
    blobs = []
    offset = 0
    for name in names:
        t = tensors[name]
        if isinstance(t, torch.Tensor):
            t = t.detach().to("cpu", torch.float32).contiguous().numpy()
        a = np.ascontiguousarray(t, dtype="<f4")
        raw = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


def load_safetensors(path):
    """Returns ({name: float32 torch tensor}, {metadata str: str}).

    Accepts F32, F64, F16 and BF16 data; everything comes back as float32. Rejects a file
    whose header is malformed or whose offsets do not match the shapes.
    """
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise UsageError(f"{path}: {len(buf)} bytes is too short for a safetensors file")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > len(buf) - 8:
        raise UsageError(f"{path}: header length {n} exceeds the file ({len(buf)} bytes)")
    try:
        header = json.loads(buf[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: header is not valid JSON ({e})")
    metadata = header.pop("__metadata__", None) or {}
    data = memoryview(buf)[8 + n:]
    tensors = {}
    for name, info in header.items():
        dtype = info.get("dtype")
        if dtype not in _ST_DTYPES:
            raise UsageError(f"{path}: tensor {name} has dtype {dtype}; "
                             f"supported: {', '.join(_ST_DTYPES)}")
        npdt, size = _ST_DTYPES[dtype]
        shape = [int(s) for s in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
        elems = int(np.prod(shape)) if shape else 1
        if not (0 <= begin <= end <= len(data)) or end - begin != elems * size:
            raise UsageError(f"{path}: tensor {name} has data_offsets [{begin}, {end}] but "
                             f"shape {shape} x {size} bytes needs {elems * size} bytes within "
                             f"{len(data)} data bytes")
        a = np.frombuffer(data[begin:end], dtype=npdt).reshape(shape)
        if dtype == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = torch.from_numpy(a.astype(np.float32, copy=True))
    return tensors, metadata


# ----------------------------------------------------------------------------------------
# llm.c token files

def write_tokens(path, tokens):
    """Writes uint16 tokens in llm.c's format (256 int32 header, then the tokens)."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > 65535):
        raise UsageError("tokens must lie in [0, 65535] for the uint16 llm.c format")
    header = np.zeros(DATA_HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = DATA_MAGIC, DATA_VERSION, tokens.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def read_tokens(path):
    """Returns the tokens of an llm.c file as an int64 numpy array."""
    try:
        header = np.fromfile(path, dtype="<i4", count=DATA_HEADER_INTS)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e}")
    if header.size != DATA_HEADER_INTS or header[0] != DATA_MAGIC or header[1] != DATA_VERSION:
        raise UsageError(f"{path} is not an llm.c token file (want magic {DATA_MAGIC}, "
                         f"version {DATA_VERSION} in a {DATA_HEADER_INTS}-int32 header)")
    count = int(header[2])
    tokens = np.fromfile(path, dtype="<u2", offset=DATA_HEADER_INTS * 4)
    if tokens.size < count:
        raise UsageError(f"{path}: header says {count} tokens but the file holds {tokens.size}")
    return tokens[:count].astype(np.int64)


def batch_at(tokens, start, batch, seq):
    """Inputs tokens[start : start+B*T] and targets shifted by one, both B x T."""
    n = batch * seq
    chunk = torch.from_numpy(tokens[start:start + n + 1])
    return chunk[:-1].view(batch, seq), chunk[1:].view(batch, seq)


# ----------------------------------------------------------------------------------------
# the model

class Conv1D(nn.Module):
    """GPT-2's linear layer: weight stored [in, out], y = x @ W + b."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class Attention(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(d_model, 3 * d_model)
        self.c_proj = Conv1D(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.n_head
        # [q | k | v], each [d]; head h owns columns h*hd .. (h+1)*hd of each.
        q, k, v = self.c_attn(x).split(d, dim=2)
        q = q.view(b, t, self.n_head, hd).transpose(1, 2)
        k = k.view(b, t, self.n_head, hd).transpose(1, 2)
        v = v.view(b, t, self.n_head, hd).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu_(1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, d)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.c_fc = Conv1D(d_model, d_ff)
        self.c_proj = Conv1D(d_ff, d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d_model, n_head, d_ff):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.attn = Attention(d_model, n_head)
        self.ln_2 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.mlp = Mlp(d_model, d_ff)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg["vocab"], cfg["d_model"])
        self.wpe = nn.Embedding(cfg["seq_len"], cfg["d_model"])
        self.h = nn.ModuleList(Block(cfg["d_model"], cfg["n_head"], cfg["d_ff"])
                               for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(cfg["d_model"], eps=LN_EPS)


class Gpt(nn.Module):
    """GPT-2 whose state_dict names are exactly Hugging Face's (transformer.*)."""

    def __init__(self, cfg):
        super().__init__()
        check_config(cfg)
        self.cfg = dict(cfg)
        self.transformer = Transformer(cfg)

    def forward(self, idx, targets=None):
        tr = self.transformer
        t = idx.shape[1]
        if t > tr.wpe.weight.shape[0]:
            raise UsageError(f"sequence length {t} exceeds the model's seq_len "
                             f"{tr.wpe.weight.shape[0]}")
        x = tr.wte(idx) + tr.wpe.weight[:t]
        for block in tr.h:
            x = block(x)
        logits = F.linear(tr.ln_f(x), tr.wte.weight)  # tied LM head: ln_f(x) @ wte^T
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))

    def init_weights(self, seed, std=0.02, perturb=0.0):
        """meshtrain's init: N(0, std); residual projections N(0, std/sqrt(2 n_layer));
        biases 0, LayerNorm weight 1 and bias 0. With perturb > 0, biases and LayerNorm
        parameters get N(0, perturb) noise added, so a cross-check exercises every tensor."""
        g = torch.Generator().manual_seed(seed)
        resid_std = std / math.sqrt(2 * self.cfg["n_layer"])
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.normal_(0.0, resid_std, generator=g)
                elif p.dim() == 2:
                    p.normal_(0.0, std, generator=g)
                elif ".ln_" in name and name.endswith(".weight"):
                    p.fill_(1.0)
                else:
                    p.zero_()
                if perturb > 0 and p.dim() == 1:
                    p.add_(torch.empty_like(p).normal_(0.0, perturb, generator=g))
        return self


def check_config(cfg):
    for k in META_KEYS:
        if int(cfg.get(k, 0)) <= 0:
            raise UsageError(f"model shape needs {k} > 0 (got {cfg.get(k)})")
    if cfg["d_model"] % cfg["n_head"]:
        raise UsageError(f"n_head={cfg['n_head']} does not divide d_model={cfg['d_model']}")


def _normalise_name(name):
    # Hugging Face's own gpt2 files name tensors without the "transformer." prefix.
    return name if name.startswith("transformer.") or name.startswith("lm_head.") \
        else "transformer." + name


def model_from_safetensors(path, n_head=None):
    """Builds a Gpt from a safetensors file; shapes come from the tensors, n_head from the
    metadata (or the argument when the file has none)."""
    tensors, meta = load_safetensors(path)
    tensors = {_normalise_name(k): v for k, v in tensors.items()}
    # Buffers some exporters add; not parameters.
    for k in [k for k in tensors if k.endswith((".attn.bias", ".attn.masked_bias"))
              and tensors[k].dim() != 1]:
        del tensors[k]
    if "transformer.wte.weight" not in tensors:
        raise UsageError(f"{path} has no transformer.wte.weight; is it a GPT-2 file?")
    vocab, d_model = tensors["transformer.wte.weight"].shape
    n_layer = 0
    while f"transformer.h.{n_layer}.ln_1.weight" in tensors:
        n_layer += 1
    if n_head is None:
        if "n_head" not in meta:
            raise UsageError(f"{path} has no n_head in its metadata; pass --n-head")
        n_head = int(meta["n_head"])
    cfg = {"n_layer": n_layer, "n_head": int(n_head), "d_model": int(d_model),
           "d_ff": int(tensors["transformer.h.0.mlp.c_fc.weight"].shape[1]) if n_layer else 1,
           "vocab": int(vocab), "seq_len": int(tensors["transformer.wpe.weight"].shape[0])}
    for k in META_KEYS:
        if k in meta and int(meta[k]) != cfg[k] and k != "n_head":
            raise UsageError(f"{path}: metadata {k}={meta[k]} disagrees with the tensors "
                             f"({cfg[k]})")
    lm_head = tensors.pop("lm_head.weight", None)
    if lm_head is not None and not torch.equal(lm_head, tensors["transformer.wte.weight"]):
        raise UsageError(f"{path}: lm_head.weight differs from transformer.wte.weight; "
                         "meshtrain's GPT-2 ties them")
    model = Gpt(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise UsageError(f"{path}: tensor names do not match GPT-2 (missing {missing[:5]}, "
                         f"unexpected {extra[:5]})")
    for k, v in tensors.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise UsageError(f"{path}: {k} has shape {list(v.shape)}, expected "
                             f"{list(expected[k].shape)}")
    model.load_state_dict(tensors)
    return model


def export_tensors(model):
    return {k: v for k, v in model.state_dict().items()}


def metadata_of(cfg):
    return {k: str(cfg[k]) for k in META_KEYS}


# ----------------------------------------------------------------------------------------
# modes

def evaluate(model, tokens, batch, seq, batches, dtype=torch.float32):
    """Mean cross-entropy over `batches` consecutive batches; batch k reads tokens
    [k*B*T, (k+1)*B*T + 1). The per-batch means are averaged in float64."""
    need = batches * batch * seq + 1
    if tokens.size < need:
        raise UsageError(f"{batches} batches of {batch}x{seq} need {need} tokens; "
                         f"the data holds {tokens.size}")
    vocab = model.cfg["vocab"]
    top = int(tokens[:need].max())
    if top >= vocab:
        raise UsageError(f"token {top} in the data is >= the model's vocab {vocab}")
    model = model.to(dtype).eval()
    total = 0.0
    with torch.no_grad():
        for k in range(batches):
            x, y = batch_at(tokens, k * batch * seq, batch, seq)
            total += float(model(x, y))
    return total / batches


def cmd_eval(args):
    torch.set_num_threads(args.threads)
    model = model_from_safetensors(args.weights, n_head=args.n_head)
    tokens = read_tokens(args.data)
    dtype = torch.float64 if args.double else torch.float32
    loss = evaluate(model, tokens, args.batch, args.seq, args.batches, dtype)
    print(json.dumps({"loss": loss}))


def cfg_from_args(args):
    cfg = {"n_layer": args.n_layer, "n_head": args.n_head, "d_model": args.d_model,
           "d_ff": args.d_ff if args.d_ff else 4 * args.d_model, "vocab": args.vocab,
           "seq_len": args.seq}
    check_config(cfg)
    return cfg


def cmd_make_weights(args):
    cfg = cfg_from_args(args)
    model = Gpt(cfg).init_weights(args.seed, std=args.std, perturb=args.perturb)
    save_safetensors(args.out, export_tensors(model), metadata_of(cfg))
    print(json.dumps({"out": args.out, **cfg,
                      "params": sum(p.numel() for p in model.parameters())}))


def make_optimizer(model, lr):
    """AdamW(0.9, 0.95), eps 1e-8; weight decay 0.1 on 2-D tensors (embeddings included),
    0 on biases and LayerNorm."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)


def cmd_train(args):
    if args.steps < 3:
        raise UsageError(f"--steps {args.steps}: need at least 3 (the first 2 are warm-up)")
    cfg = cfg_from_args(args)
    tokens = read_tokens(args.data)
    n = args.batch * args.seq
    if tokens.size < n + 1:
        raise UsageError(f"{args.data} holds {tokens.size} tokens; one {args.batch}x{args.seq} "
                         f"batch needs {n + 1}")
    if int(tokens.max()) >= cfg["vocab"]:
        raise UsageError(f"token {int(tokens.max())} in {args.data} is >= --vocab {cfg['vocab']}")
    if args.ranks == 1:
        return train_worker(0, 1, args, cfg, tokens)
    import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(train_worker, args=(args.ranks, args, cfg, tokens), nprocs=args.ranks, join=True)
    return 0


def _free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_worker(rank, world, args, cfg, tokens):
    """One data-parallel rank (or the whole run when world == 1). Rank r trains on token
    windows s*world + r; with world > 1 the model is wrapped in DDP over gloo."""
    torch.set_num_threads(args.threads)
    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        if args.pin:
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model = Gpt(cfg).init_weights(args.seed)
    model.train()
    net = DistributedDataParallel(model) if world > 1 else model
    opt = make_optimizer(model, args.lr)
    n = args.batch * args.seq
    windows = (tokens.size - 1) // n
    log = sys.stderr if rank == 0 else None
    times = []
    for step in range(args.steps):
        x, y = batch_at(tokens, ((step * world + rank) % windows) * n, args.batch, args.seq)
        t0 = time.perf_counter()
        # bf16: torch.autocast around the forward (its matmuls on bf16 operands in oneDNN, f32
        # weights, gradients and optimizer state), as PyTorch's mixed precision is used.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = net(x, y)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = float(loss)
        dt = time.perf_counter() - t0
        times.append(dt)
        if not math.isfinite(lv):
            print(f"[rank {rank}] step {step}: loss is {lv}", file=sys.stderr)
            sys.exit(1)
        if log:
            print(json.dumps({"step": step, "loss": lv, "grad_norm": float(grad_norm),
                              "time_s": dt, "tokens_per_s": world * n / dt}), file=log)
    timed = times[2:]
    if world > 1:
        import torch.distributed as dist
        slowest = torch.tensor([sum(timed)], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        total = float(slowest)
        dist.destroy_process_group()
    else:
        total = sum(timed)
    if rank == 0:
        print(json.dumps({"tokens_per_s": world * n * len(timed) / total,
                          "step_time_s": total / len(timed), "steps": args.steps,
                          "ranks": world, "threads": args.threads, "dtype": args.dtype,
                          "batch": args.batch,
                          "seq": args.seq, "params": sum(p.numel() for p in model.parameters())}),
              flush=True)
    return 0


BLAS_CORETYPES = ("unset", "Haswell", "SkylakeX", "Cooperlake")


def cmd_blas_coretype(args):
    """OpenBLAS picks kernels from the CPU model, once, when it loads; so each candidate
    OPENBLAS_CORETYPE is measured in a fresh process (1 thread, sgemm 1024^3)."""
    import subprocess
    probe = ("import time, torch\n"
             "torch.set_num_threads(1)\n"
             "a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)\n"
             "a @ b\n"
             "t = time.perf_counter()\n"
             "for _ in range(8):\n"
             "    a @ b\n"
             "print(8 * 2 * 1024 ** 3 / (time.perf_counter() - t) / 1e9)\n")
    gflops = {}
    for core in BLAS_CORETYPES:
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        env["OPENBLAS_NUM_THREADS"] = "1"
        if core != "unset":
            env["OPENBLAS_CORETYPE"] = core
        r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                           text=True, check=True)
        gflops[core] = round(float(r.stdout.strip().splitlines()[-1]), 1)
    print(json.dumps({"best": max(gflops, key=gflops.get), "gflops": gflops}))
    return 0


def cmd_bf16_probe(args):
    """The bf16 GEMM torch.autocast gives a GPT's linears (1 thread, 1024^3 under autocast),
    whether oneDNN (MKL-DNN) is there to run it, and the CPU capability PyTorch dispatches
    its own kernels to."""
    torch.set_num_threads(1)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = a @ b
        t = time.perf_counter()
        for _ in range(8):
            out = a @ b
        gflops = 8 * 2 * 1024 ** 3 / (time.perf_counter() - t) / 1e9
    capability = "?"
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage" in line:
            capability = line.split(":", 1)[1].strip()
    print(json.dumps({"gflops": round(gflops, 1), "dtype": str(out.dtype),
                      "mkldnn": bool(torch.backends.mkldnn.is_available()),
                      "capability": capability}))
    return 0


def add_shape_args(p, required):
    p.add_argument("--n-layer", type=int, required=required)
    p.add_argument("--n-head", type=int, required=required)
    p.add_argument("--d-model", type=int, required=required)
    p.add_argument("--d-ff", type=int, default=0, help="default 4 * d_model")
    p.add_argument("--vocab", type=int, required=required)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)

    t = sub.add_parser("train", help="train; last stdout line is JSON with tokens_per_s")
    add_shape_args(t, required=True)
    t.add_argument("--seq", type=int, required=True)
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--data", required=True)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--ranks", type=int, default=1,
                   help="data-parallel processes (DDP over gloo); --batch is per rank")
    t.add_argument("--pin", action="store_true", help="pin rank r to the r-th allowed CPU")
    t.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                   help="bf16: torch.autocast(bfloat16) around the forward")

    e = sub.add_parser("eval", help="mean loss of a safetensors model; prints {\"loss\": ...}")
    e.add_argument("--weights", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--batch", type=int, required=True)
    e.add_argument("--seq", type=int, required=True)
    e.add_argument("--batches", type=int, required=True)
    e.add_argument("--n-head", type=int, default=None,
                   help="only for files without n_head metadata")
    e.add_argument("--threads", type=int, default=1)
    e.add_argument("--double", action="store_true", help="compute in float64 (reference)")

    m = sub.add_parser("make-weights", help="write a random GPT-2 as safetensors")
    add_shape_args(m, required=True)
    m.add_argument("--seq", type=int, required=True, help="seq_len (rows of wpe)")
    m.add_argument("--seed", type=int, default=1234)
    m.add_argument("--std", type=float, default=0.02)
    m.add_argument("--perturb", type=float, default=0.0,
                   help="add N(0, PERTURB) noise to biases and LayerNorm parameters")
    m.add_argument("--out", required=True)

    sub.add_parser("blas-coretype",
                   help="measure 1-core sgemm for each OPENBLAS_CORETYPE; print the best")
    sub.add_parser("bf16-probe", help="measure 1-core bf16 matmul under torch.autocast")

    args = ap.parse_args(argv)
    for name in ("batch", "seq", "batches", "threads", "steps", "ranks"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) <= 0:
            raise UsageError(f"--{name} must be positive (got {getattr(args, name)})")
    if args.mode == "train":
        return cmd_train(args)
    if args.mode == "eval":
        return cmd_eval(args) or 0
    if args.mode == "blas-coretype":
        return cmd_blas_coretype(args)
    if args.mode == "bf16-probe":
        return cmd_bf16_probe(args)
    return cmd_make_weights(args) or 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as err:
        print(f"torch_gpt.py: {err}", file=sys.stderr)
        sys.exit(2)
