#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/READER/): for each reader
a few small valid files and near-misses (docs/fuzzing.md). Deterministic: rerun it after a
format change and commit the result.

    tests/fuzz/make_seeds.py [CHECKPOINT_INDEX_JSON]

The checkpoint seeds derive from the index.json that the checkpoint_index harness writes for
its fixed shard files: MESHTRAIN_FUZZ_SEED_OUT=/tmp/index.json build/fuzz/tests/fuzz/
fuzz_checkpoint_index -runs=0 writes it (scripts/fuzz.sh seeds does both).
"""
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(reader, name, data):
    d = os.path.join(ROOT, reader)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def compact(obj):
    return json.dumps(obj, separators=(",", ":"))


# ---- safetensors ------------------------------------------------------------------------

def safetensors(tensors, metadata=None, header_len=None):
    """tensors: [(name, dtype, shape, raw bytes)] in file order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = compact(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + data


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def bf16(n, start=0):
    # bf16 of small integers: the high half of their f32
    return b"".join(struct.pack("<f", float(start + i))[2:] for i in range(n))


def seeds_safetensors():
    put("safetensors", "valid-f32", safetensors([("a", "F32", [2, 2], f32(1, 2, 3, 4))], {"k": "v"}))
    put("safetensors", "valid-bf16-f16",
        safetensors([("b", "BF16", [3], bf16(3)), ("h", "F16", [1], struct.pack("<H", 0x3C00))]))
    put("safetensors", "offsets-past-end",
        safetensors([("a", "F32", [2], f32(1, 2))])[:-4])
    put("safetensors", "header-length-past-end", safetensors([("a", "F32", [1], f32(1))], header_len=4096))
    raw = safetensors([("a", "I64", [1], b"\0" * 8)])
    put("safetensors", "unknown-dtype", raw)


# ---- hf_weights (eval --weights) ---------------------------------------------------------

def seeds_hf_weights():
    V, D, T, F = 5, 4, 4, 8
    specs = [("transformer.wte.weight", [V, D]), ("transformer.wpe.weight", [T, D]),
             ("transformer.h.0.ln_1.weight", [D]), ("transformer.h.0.ln_1.bias", [D]),
             ("transformer.h.0.attn.c_attn.weight", [D, 3 * D]),
             ("transformer.h.0.attn.c_attn.bias", [3 * D]),
             ("transformer.h.0.attn.c_proj.weight", [D, D]), ("transformer.h.0.attn.c_proj.bias", [D]),
             ("transformer.h.0.ln_2.weight", [D]), ("transformer.h.0.ln_2.bias", [D]),
             ("transformer.h.0.mlp.c_fc.weight", [D, F]), ("transformer.h.0.mlp.c_fc.bias", [F]),
             ("transformer.h.0.mlp.c_proj.weight", [F, D]), ("transformer.h.0.mlp.c_proj.bias", [D]),
             ("transformer.ln_f.weight", [D]), ("transformer.ln_f.bias", [D])]

    def numel(s):
        n = 1
        for x in s:
            n *= x
        return n

    tensors = [(n, "BF16", s, bf16(numel(s), i)) for i, (n, s) in enumerate(specs)]
    put("hf_weights", "valid-gpt2-bf16", safetensors(tensors, {"n_head": "2"}))
    put("hf_weights", "no-n-head", safetensors(tensors))  # the harness passes --n-head 1
    bad = list(tensors)
    bad[4] = (bad[4][0], "BF16", [3 * D, D], bad[4][3])  # c_attn not transposed
    put("hf_weights", "shape-mismatch", safetensors(bad, {"n_head": "2"}))


# ---- token_file (llm.c) -------------------------------------------------------------------

def token_file(tokens, count=None, magic=20240520, version=1):
    header = [magic, version, len(tokens) if count is None else count] + [0] * 253
    return struct.pack("<256i", *header) + struct.pack("<%dH" % len(tokens), *tokens)


def seeds_token_file():
    # The harness takes the vocabulary from the last byte: here 256 (byte % 4 == 0).
    put("token_file", "valid-bytes", token_file([72, 101, 108, 108, 111, 32, 33, 0]))
    put("token_file", "count-past-end", token_file([1, 2, 3, 4], count=9))
    put("token_file", "token-over-vocab", token_file([1, 300, 2, 1024]))


# ---- config_file (train --config) ---------------------------------------------------------

def seeds_config_file():
    put("config_file", "valid-tiny",
        compact({"model": "tiny", "steps": 10, "lr": 0.001, "batch": 8, "dp": 2, "zero": 1, "seed": 1}))
    put("config_file", "valid-custom-pp",
        compact({"n_layer": 4, "n_head": 2, "d_model": 64, "vocab": 256, "seq": 32, "bias": False,
                 "pp": 2, "schedule": "interleaved", "virtual_stages": 2, "microbatches": 4,
                 "batch": 8, "tp": 2, "sp": True, "dtype": "bf16", "recompute": "selective"}))
    put("config_file", "integer-as-float", compact({"steps": 8.7}))
    put("config_file", "unknown-key", compact({"model": "tiny", "stpes": 10}))
    put("config_file", "out-of-range", compact({"dp": 4294967297, "n_layer": -1}))


# ---- cluster_file (plan --cluster) ---------------------------------------------------------

def seeds_cluster_file():
    gpu = {"name": "H100-SXM5-80GB", "peak_flops_bf16": 9.89e14, "peak_flops_f32": 6.7e13,
           "hbm_bytes": 85899345920.0, "hbm_bytes_per_s": 3.35e12, "hbm_efficiency": 0.7,
           "gemm_eff_max": 0.7, "gemm_d0": 64.0, "kernel_overhead_s": 0.0}
    dgx = {"name": "dgx-h100", "gpu": gpu, "gpus_per_node": 8, "max_nodes": 0,
           "intra_bytes_per_s": 3.6e11, "intra_latency_s": 4e-06, "inter_bytes_per_s": 4.5e10,
           "inter_latency_s": 8e-06, "compute_units": 0, "backend": "", "host_links": []}
    put("cluster_file", "valid-dgx-h100", compact(dgx))
    host = dict(dgx, name="this-host", gpus_per_node=1, compute_units=2, backend="local",
                host_links=[{"ranks": 2, "latency_s": 2e-05, "bytes_per_s": 5e9},
                            {"ranks": 8, "latency_s": 1e-4, "bytes_per_s": 1e9}])
    put("cluster_file", "valid-this-host", compact(host))
    put("cluster_file", "fraction-gpus", compact(dict(dgx, gpus_per_node=8.5)))
    put("cluster_file", "efficiency-above-one", compact(dict(dgx, gpu=dict(gpu, gemm_eff_max=1.5))))


# ---- checkpoint_index -------------------------------------------------------------------

def seeds_checkpoint_index(index_path):
    with open(index_path) as f:
        idx = json.load(f)
    put("checkpoint_index", "valid-tp2", compact(idx))
    bad = json.loads(json.dumps(idx))
    bad["pieces"][1]["offsets"][2] = bad["files"][0]["bytes"] - 4
    put("checkpoint_index", "offset-past-end", compact(bad))
    bad = json.loads(json.dumps(idx))
    bad["config"]["n_layer"] = 1000000
    put("checkpoint_index", "model-larger-than-files", compact(bad))


# ---- safetensors_shards -------------------------------------------------------------------

def shards_input(index, first, second):
    """The harness's input: uint16 index length, uint16 first-shard length, then the three."""
    if isinstance(index, str):
        index = index.encode()
    return struct.pack("<HH", len(index), len(first)) + index + first + second


def seeds_safetensors_shards():
    a = safetensors([("model.embed_tokens.weight", "F32", [2, 2], f32(1, 2, 3, 4))])
    b = safetensors([("model.norm.weight", "BF16", [2], b"\x80\x3f\x00\x40"),
                     ("lm_head.weight", "F16", [1, 2], b"\x00\x3c\x00\x40")])
    one, two = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    good = {"metadata": {"total_size": 28},
            "weight_map": {"model.embed_tokens.weight": one, "model.norm.weight": two,
                           "lm_head.weight": two}}
    put("safetensors_shards", "two-shards", shards_input(compact(good), a, b))
    only = {"weight_map": {"model.embed_tokens.weight": one}}
    put("safetensors_shards", "one-shard", shards_input(compact(only), a, b""))
    for name, target in [("path-escape", "../" + one), ("absolute", "/etc/hostname"),
                         ("not-safetensors", "model.bin"), ("empty-name", "")]:
        bad = json.loads(compact(good))
        bad["weight_map"]["model.embed_tokens.weight"] = target
        put("safetensors_shards", name, shards_input(compact(bad), a, b))
    wrong = json.loads(compact(good))
    wrong["weight_map"]["model.norm.weight"] = one
    put("safetensors_shards", "tensor-in-other-shard", shards_input(compact(wrong), a, b))
    missing = json.loads(compact(good))
    missing["weight_map"]["model.layers.0.mlp.up_proj.weight"] = two
    put("safetensors_shards", "mapped-tensor-missing", shards_input(compact(missing), a, b))
    put("safetensors_shards", "truncated-shard", shards_input(compact(good), a, b[:-3]))
    put("safetensors_shards", "not-json", shards_input('{"weight_map": {', a, b))
    put("safetensors_shards", "no-weight-map", shards_input("{}", a, b))


def main():
    seeds_safetensors()
    seeds_safetensors_shards()
    seeds_hf_weights()
    seeds_token_file()
    seeds_config_file()
    seeds_cluster_file()
    if len(sys.argv) > 1:
        seeds_checkpoint_index(sys.argv[1])
    elif not os.path.isdir(os.path.join(ROOT, "checkpoint_index")):
        sys.exit("make_seeds.py: give the checkpoint harness's index.json (see the docstring)")


if __name__ == "__main__":
    main()
