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


# ---- megatron_file (Megatron-LM PREFIX.idx + PREFIX.bin) ----------------------------------

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {"uint8": (1, "B"), "int32": (4, "i"), "float32": (7, "f"), "uint16": (8, "H")}


def megatron_pair(documents, dtype, magic=MEGATRON_MAGIC, version=1, sequences=None,
                  doc_count=None, pointers=None, doc_index=None, modes=False):
    """documents: [[token, ...], ...], one sequence each. Returns (idx bytes, bin bytes) in
    Megatron-LM's layout (docs/data.md); the keyword arguments damage one field."""
    code, fmt = MEGATRON_DTYPES[dtype]
    width = struct.calcsize(fmt)
    lengths = [len(d) for d in documents]
    if pointers is None:
        pointers, at = [], 0
        for n in lengths:
            pointers.append(at)
            at += n * width
    if doc_index is None:
        doc_index = list(range(len(documents) + 1))
    idx = magic + struct.pack("<QB", version, code)
    idx += struct.pack("<QQ", len(lengths) if sequences is None else sequences,
                       len(doc_index) if doc_count is None else doc_count)
    idx += struct.pack("<%di" % len(lengths), *lengths)
    idx += struct.pack("<%dq" % len(pointers), *pointers)
    idx += struct.pack("<%dq" % len(doc_index), *doc_index)
    if modes:
        idx += b"\x00" * len(lengths)
    tokens = [t for d in documents for t in d]
    return idx, struct.pack("<%d%s" % (len(tokens), fmt), *tokens)


# The harness's vocabularies (megatron_file_fuzz.cpp kVocabs) by the selector byte.
MEGATRON_VOCAB = {256: 0, 50257: 1, 65536: 2, 128256: 3, 1: 4, 2 ** 31: 5}


def megatron_input(pair, vocab=256, name_form=0):
    """The harness's input: uint16 .idx length, vocab selector, name form (0 PREFIX, 1 PREFIX.idx,
    2 PREFIX.bin), the .idx, the .bin."""
    idx, bin_ = pair
    return struct.pack("<HBB", len(idx), MEGATRON_VOCAB[vocab], name_form) + idx + bin_


def seeds_megatron_file():
    text = [[72, 101, 108, 108, 111], [33, 0, 5], [10]]
    put("megatron_file", "valid-uint16", megatron_input(megatron_pair(text, "uint16")))
    llama3 = [[128000, 9906, 1917, 128001], [128000, 40, 128255]]
    put("megatron_file", "valid-int32-llama3-vocab",
        megatron_input(megatron_pair(llama3, "int32"), vocab=128256, name_form=1))
    put("megatron_file", "valid-uint8-multimodal",
        megatron_input(megatron_pair(text, "uint8", modes=True), name_form=2))
    put("megatron_file", "empty-document",
        megatron_input(megatron_pair([[1, 2], [], [3]], "uint16"), vocab=50257))
    put("megatron_file", "bad-magic",
        megatron_input(megatron_pair(text, "uint16", magic=b"MMIDIDY\x00\x00")))
    idx, bin_ = megatron_pair(text, "uint16")
    put("megatron_file", "truncated-index", megatron_input((idx[:-8], bin_)))
    put("megatron_file", "counts-past-index",
        megatron_input(megatron_pair(text, "uint16", sequences=2 ** 62)))
    put("megatron_file", "bin-shorter-than-lengths", megatron_input((idx, bin_[:-2])))
    put("megatron_file", "token-over-vocab",
        megatron_input(megatron_pair([[1, 300, 2]], "uint16"), vocab=256))
    put("megatron_file", "int32-over-uint16-vocab",
        megatron_input(megatron_pair(llama3, "int32"), vocab=65536))
    put("megatron_file", "pointers-out-of-order",
        megatron_input(megatron_pair(text, "uint16", pointers=[0, 12, 10])))
    put("megatron_file", "document-index-short",
        megatron_input(megatron_pair(text, "uint16", doc_index=[0, 2])))
    put("megatron_file", "float32-dtype", megatron_input(megatron_pair([[1.0, 2.0]], "float32")))


# ---- hf_llama (eval --weights DIR, train --init-from DIR) ---------------------------------

def llama_config(D=8, H=2, KV=1, F=12, V=5, L=1, T=16, tied=False, scaling=False, **extra):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D,
         "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H,
         "num_key_value_heads": KV, "head_dim": D // H, "vocab_size": V,
         "max_position_embeddings": T, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
         "tie_word_embeddings": tied, "hidden_act": "silu", "attention_bias": False,
         "mlp_bias": False, "torch_dtype": "bfloat16", "rope_scaling": None}
    if scaling:
        c["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
    c.update(extra)
    return c


def llama_tensors(D=8, H=2, KV=1, F=12, V=5, L=1, tied=False, dtype="BF16", **_):
    """LlamaForCausalLM's tensors of that shape (small integers as values)."""
    kv = KV * (D // H)
    specs = [("model.embed_tokens.weight", [V, D])]
    for i in range(L):
        h = "model.layers.%d." % i
        specs += [(h + "input_layernorm.weight", [D]), (h + "self_attn.q_proj.weight", [D, D]),
                  (h + "self_attn.k_proj.weight", [kv, D]), (h + "self_attn.v_proj.weight", [kv, D]),
                  (h + "self_attn.o_proj.weight", [D, D]),
                  (h + "post_attention_layernorm.weight", [D]),
                  (h + "mlp.gate_proj.weight", [F, D]), (h + "mlp.up_proj.weight", [F, D]),
                  (h + "mlp.down_proj.weight", [D, F])]
    specs.append(("model.norm.weight", [D]))
    if not tied:
        specs.append(("lm_head.weight", [V, D]))
    out = []
    for k, (name, shape) in enumerate(specs):
        n = 1
        for x in shape:
            n *= x
        raw = bf16(n, k) if dtype == "BF16" else f32(*[float(k + i % 7) for i in range(n)])
        out.append((name, dtype, shape, raw))
    return out


def llama_input(config, tensors):
    """The harness's input: uint32 config length, config.json (b"": none), model.safetensors."""
    text = b"" if config is None else json.dumps(config, indent=2).encode()
    return struct.pack("<I", len(text)) + text + safetensors(tensors, {"format": "pt"})


def seeds_hf_llama():
    gqa = dict(KV=1, tied=False)
    put("hf_llama", "valid-gqa-untied", llama_input(llama_config(**gqa), llama_tensors(**gqa)))
    mha = dict(KV=2, tied=True, scaling=True, dtype="F32")
    put("hf_llama", "valid-mha-tied-rope-llama3",
        llama_input(llama_config(**mha), llama_tensors(**mha)))
    two = dict(KV=1, tied=True, L=2, D=4, F=6)
    put("hf_llama", "valid-gqa-tied-2-layers-llama3",
        llama_input(llama_config(scaling=True, **two), llama_tensors(**two)))
    put("hf_llama", "no-config-json", llama_input(None, llama_tensors(**gqa)))
    renamed = [(n.replace("k_proj", "key_proj"), d, s, r) for n, d, s, r in llama_tensors(**gqa)]
    put("hf_llama", "k-proj-misnamed", llama_input(llama_config(**gqa), renamed))
    # Claims the file cannot hold: the model must be refused before it is allocated.
    put("hf_llama", "model-larger-than-file",
        llama_input(llama_config(**dict(gqa, L=1000000)), llama_tensors(**gqa)))
    put("hf_llama", "positions-larger-than-file",
        llama_input(llama_config(**dict(gqa, T=2 ** 31)), llama_tensors(**gqa)))
    # Numbers a C++ conversion cannot take: rms_norm_eps past float's range, head_dim x heads
    # past int64.
    put("hf_llama", "eps-past-float",
        llama_input(llama_config(**dict(gqa, rms_norm_eps=1e300)), llama_tensors(**gqa)))
    put("hf_llama", "head-dim-overflow",
        llama_input(llama_config(**dict(gqa, head_dim=2 ** 62)), llama_tensors(**gqa)))
    put("hf_llama", "rope-scaling-unknown-type",
        llama_input(llama_config(**dict(gqa, rope_scaling={"type": "yarn", "factor": 4.0})),
                    llama_tensors(**gqa)))


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
    seeds_megatron_file()
    seeds_hf_llama()
    if len(sys.argv) > 1:
        seeds_checkpoint_index(sys.argv[1])
    elif not os.path.isdir(os.path.join(ROOT, "checkpoint_index")):
        sys.exit("make_seeds.py: give the checkpoint harness's index.json (see the docstring)")


if __name__ == "__main__":
    main()
