#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<harness>/ from the test fixtures (tests/data), small
enough to commit: fixtures copied when they are a few KB, otherwise cut down (tokenizers trimmed
to a few hundred tokens, tiny checkpoints with the fixtures' layouts). Plain Python (struct,
json); the .qf seeds come from `qforge convert` of the tiny checkpoints written here, with the
binary given by --qforge (skipped when absent). Deterministic: rerun after changing a fixture.

    python3 fuzz/make_corpus.py [--qforge build/cli/qforge]
"""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
SEP = b"\n@@qforge-file@@\n"  # fuzz/fuzz_support.hpp, kFileSeparator


def data(*p):
    with open(os.path.join(DATA, *p), "rb") as f:
        return f.read()


def put(harness, name, content):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(content)


def frames(*parts):
    return SEP.join(parts)


def jdump(obj):
    return json.dumps(obj, indent=1, ensure_ascii=False).encode()


# --- safetensors -----------------------------------------------------------------------------

DT_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "F64": 8, "I8": 1, "U8": 1}


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def f16_bytes(vals):
    return struct.pack("<%de" % len(vals), *vals)


def f32_bytes(vals):
    return struct.pack("<%df" % len(vals), *vals)


def bf16_bytes(vals):
    return b"".join(struct.pack("<f", v)[2:] for v in vals)


def rand_vals(rng, n, scale=0.1):
    return [rng.uniform(-scale, scale) for _ in range(n)]


# --- a tiny Llama (the layout of formats/architectures: HF names) ----------------------------

def tiny_config(hidden, heads, kv, inter, vocab, layers=1, tied=True, extra=None, arch="llama"):
    c = {
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": arch, "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": hidden // heads, "intermediate_size": inter,
        "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": tied,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16",
    }
    c.update(extra or {})
    return c


def linear_shapes(c):
    h, hd = c["hidden_size"], c["head_dim"]
    q, kv, i = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, c["intermediate_size"]
    return [("self_attn.q_proj", q, h), ("self_attn.k_proj", kv, h), ("self_attn.v_proj", kv, h),
            ("self_attn.o_proj", h, q), ("mlp.gate_proj", i, h), ("mlp.up_proj", i, h),
            ("mlp.down_proj", h, i)]


def float_model(c, rng, dtype="F16"):
    enc = {"F16": f16_bytes, "F32": f32_bytes, "BF16": bf16_bytes}[dtype]
    h, v = c["hidden_size"], c["vocab_size"]
    t = [("model.embed_tokens.weight", dtype, [v, h], enc(rand_vals(rng, v * h))),
         ("model.norm.weight", dtype, [h], enc([1.0] * h))]
    if not c["tie_word_embeddings"]:
        t.append(("lm_head.weight", dtype, [v, h], enc(rand_vals(rng, v * h))))
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        t.append((p + "input_layernorm.weight", dtype, [h], enc([1.0] * h)))
        t.append((p + "post_attention_layernorm.weight", dtype, [h], enc([1.0] * h)))
        for name, n, k in linear_shapes(c):
            t.append((p + name + ".weight", dtype, [n, k], enc(rand_vals(rng, n * k))))
            if c.get("model_type") == "qwen2" and name in ("self_attn.q_proj", "self_attn.k_proj",
                                                          "self_attn.v_proj"):
                t.append((p + name + ".bias", dtype, [n], enc(rand_vals(rng, n))))
    return t


def i32(vals):
    return struct.pack("<%di" % len(vals), *vals)


def pack_words(codes, bits):
    """codes: list of ints < 2^bits, len multiple of 32/bits -> int32 words, low bits first."""
    per = 32 // bits
    out = []
    for w in range(len(codes) // per):
        word = 0
        for j in range(per):
            word |= codes[w * per + j] << (bits * j)
        out.append(word - (1 << 32) if word >= 1 << 31 else word)
    return out


def gptq_model(c, rng, bits, group, awq=False):
    """GPTQ v1 / AWQ GEMM packing as convert/hf_quantized.hpp describes; random codes, zero 8."""
    h, v = c["hidden_size"], c["vocab_size"]
    t = [("model.embed_tokens.weight", "F16", [v, h], f16_bytes(rand_vals(rng, v * h))),
         ("model.norm.weight", "F16", [h], f16_bytes([1.0] * h))]
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        t.append((p + "input_layernorm.weight", "F16", [h], f16_bytes([1.0] * h)))
        t.append((p + "post_attention_layernorm.weight", "F16", [h], f16_bytes([1.0] * h)))
        for name, n, k in linear_shapes(c):
            g = k if group == -1 else group
            groups = -(-k // g)
            mx = (1 << bits) - 1
            codes = [[rng.randint(0, mx) for _ in range(n)] for _ in range(k)]  # [k][n]
            scales = f16_bytes([rng.uniform(0.001, 0.02) for _ in range(groups * n)])
            if awq:
                inv = [0, 4, 1, 5, 2, 6, 3, 7]
                words = []
                for i in range(k):
                    for o8 in range(n // 8):
                        w = 0
                        for j in range(8):
                            w |= codes[i][o8 * 8 + j] << (4 * inv[j])
                        words.append(w - (1 << 32) if w >= 1 << 31 else w)
                zeros = []
                for _ in range(groups):
                    for _ in range(n // 8):
                        w = sum(8 << (4 * j) for j in range(8))
                        zeros.append(w - (1 << 32) if w >= 1 << 31 else w)
                t.append((p + name + ".qweight", "I32", [k, n // 8], i32(words)))
                t.append((p + name + ".qzeros", "I32", [groups, n // 8], i32(zeros)))
                t.append((p + name + ".scales", "F16", [groups, n], scales))
            else:
                per = 32 // bits
                words = []
                for wi in range(k // per):
                    for o in range(n):
                        words += pack_words([codes[wi * per + j][o] for j in range(per)], bits)
                zero = (1 << (bits - 1)) - 1  # stored zero - 1
                zeros = []
                for _ in range(groups):
                    zeros += pack_words([zero] * n, bits)
                t.append((p + name + ".qweight", "I32", [k // per, n], i32(words)))
                t.append((p + name + ".qzeros", "I32", [groups, n // per], i32(zeros)))
                t.append((p + name + ".scales", "F16", [groups, n], scales))
                t.append((p + name + ".g_idx", "I32", [k], i32([i // g for i in range(k)])))
    return t


# --- tokenizers ------------------------------------------------------------------------------

def trim_tokenizer(family, base_keep, merges_keep):
    """The family's tokenizer cut to its first `base_keep` ids (alphabet, byte tokens) plus the
    tokens of its first `merges_keep` merges over them, renumbered densely; added tokens and
    the ids the post-processor and tokenizer_config.json name follow."""
    tj = json.loads(data("tokenizers", family, "tokenizer.json"))
    m = tj["model"]
    keep = {tok for tok, i in m["vocab"].items() if i < base_keep}
    merges = []
    for mg in m["merges"]:
        if len(merges) >= merges_keep:
            break
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in keep and b in keep and (a + b) in m["vocab"]:
            merges.append(mg)
            keep.add(a + b)
    order = sorted(keep, key=lambda t: m["vocab"][t])
    remap = {m["vocab"][t]: i for i, t in enumerate(order)}
    vocab = {t: i for i, t in enumerate(order)}
    base = len(m["vocab"])
    for a in tj["added_tokens"]:
        if a["id"] >= base:
            remap[a["id"]] = len(vocab) + a["id"] - base
        elif a["id"] not in remap:
            raise SystemExit("added token outside the trimmed vocabulary: " + family)
        a["id"] = remap[a["id"]]
    m["vocab"], m["merges"] = vocab, merges

    def fix(o):
        if isinstance(o, dict):
            for k2, v2 in o.items():
                if k2 == "ids" and isinstance(v2, list):
                    o[k2] = [remap.get(x, x) for x in v2]
                else:
                    fix(v2)
        elif isinstance(o, list):
            for x in o:
                fix(x)
    fix(tj["post_processor"])
    cfg = json.loads(data("tokenizers", family, "tokenizer_config.json"))
    if "added_tokens_decoder" in cfg:
        cfg["added_tokens_decoder"] = {str(remap.get(int(k), int(k))): v
                                       for k, v in cfg["added_tokens_decoder"].items()}
    return tj, cfg


def llama2c_vocab(n):
    """The first n tokens of tok512.bin (llama2.c's format: max_len, then score, len, bytes):
    tests/data/quant_checkpoints/tok512.bin, written by scripts/make_llama2c_vocab.py."""
    raw = data("quant_checkpoints", "tok512.bin")
    pos, toks = 4, []
    while pos < len(raw) and len(toks) < n:
        score, ln = struct.unpack_from("<fi", raw, pos)
        toks.append((score, raw[pos + 8:pos + 8 + ln]))
        pos += 8 + ln
    out = struct.pack("<i", max(len(t[1]) for t in toks))
    for score, b in toks:
        out += struct.pack("<fi", score, len(b)) + b
    return out


def llama2c_checkpoint(rng, dim, hidden, layers, heads, kv, vocab, seq, shared=True):
    hd = dim // heads
    floats = []
    add = lambda n: floats.extend(rand_vals(rng, n))
    add(vocab * dim)                      # token_embedding
    floats.extend([1.0] * (layers * dim))  # rms_att
    add(layers * dim * dim)               # wq
    add(layers * kv * hd * dim)           # wk
    add(layers * kv * hd * dim)           # wv
    add(layers * dim * dim)               # wo
    floats.extend([1.0] * (layers * dim))  # rms_ffn
    add(layers * hidden * dim)            # w1
    add(layers * dim * hidden)            # w2
    add(layers * hidden * dim)            # w3
    floats.extend([1.0] * dim)            # rms_final
    add(seq * hd // 2 * 2)                # freq_cis_real, freq_cis_imag
    if not shared:
        add(vocab * dim)                  # wcls
    header = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab if shared else -vocab, seq)
    return header + f32_bytes(floats)


# --- GGUF ------------------------------------------------------------------------------------

GG_STR, GG_ARR, GG_U32, GG_F32, GG_BOOL, GG_I32 = 8, 9, 4, 6, 7, 5


def gg_string(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gg_value(t, v):
    if t == GG_STR:
        return gg_string(v)
    if t == GG_U32:
        return struct.pack("<I", v)
    if t == GG_I32:
        return struct.pack("<i", v)
    if t == GG_F32:
        return struct.pack("<f", v)
    if t == GG_BOOL:
        return struct.pack("<B", v)
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(gg_value(et, x) for x in items)


def read_gguf_kv(raw):
    """The key/value pairs of a GGUF file, as (key, type, raw value bytes)."""
    pos = 24
    _, _, _, kvs = struct.unpack_from("<4sIQQ", raw, 0)
    out = []

    def skip(t, p):
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if t == GG_STR:
            (n,) = struct.unpack_from("<Q", raw, p)
            return p + 8 + n
        if t == GG_ARR:
            et, n = struct.unpack_from("<IQ", raw, p)
            p += 12
            for _ in range(n):
                p = skip(et, p)
            return p
        return p + sizes[t]
    for _ in range(kvs):
        (kl,) = struct.unpack_from("<Q", raw, pos)
        key = raw[pos + 8:pos + 8 + kl].decode()
        pos += 8 + kl
        (t,) = struct.unpack_from("<I", raw, pos)
        end = skip(t, pos + 4)
        out.append((key, t, raw[pos + 4:end]))
        pos = end
    return out


GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20),
        "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q2_K": (10, 256, 84),
        "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
        "Q6_K": (14, 256, 210), "BF16": (30, 1, 2)}


def gguf(kvs, tensors, align=32):
    """kvs: list of (key, type, raw value bytes); tensors: (name, type, ne, bytes)."""
    out = struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(kvs))
    for k, t, raw in kvs:
        out += gg_string(k) + struct.pack("<I", t) + raw
    off, blobs = 0, b""
    for name, ty, ne, raw in tensors:
        out += gg_string(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        out += struct.pack("<IQ", GGML[ty][0], off)
        pad = raw + b"\0" * (-len(raw) % align)
        blobs += pad
        off += len(pad)
    out += b"\0" * (-len(out) % align)
    return out + blobs


def ggml_blocks(rng, ty, elements):
    tid, be, bb = GGML[ty]
    if ty == "F32":
        return f32_bytes(rand_vals(rng, elements))
    if ty == "F16":
        return f16_bytes(rand_vals(rng, elements))
    if ty == "BF16":
        return bf16_bytes(rand_vals(rng, elements))
    blocks = b""
    for _ in range(elements // be):
        b = bytearray(rng.getrandbits(8) for _ in range(bb))
        # finite fp16 scales (0.01) where the block keeps them
        scale = struct.pack("<e", 0.01)
        if ty in ("Q4_0", "Q5_0", "Q8_0", "Q4_1", "Q5_1", "Q4_K", "Q5_K"):
            b[0:2] = scale
            if ty in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):
                b[2:4] = scale
        else:  # Q2_K, Q3_K, Q6_K: d (and dmin) last
            if ty == "Q2_K":
                b[-4:-2] = scale
            b[-2:] = scale
        blocks += bytes(b)
    return blocks


def tiny_gguf(rng, tok_kvs, types):
    h, heads, kv, inter, vocab = 32, 2, 1, 32, 300
    hd = h // heads
    meta = [("general.architecture", GG_STR, gg_value(GG_STR, "llama")),
            ("general.name", GG_STR, gg_value(GG_STR, "fuzz seed")),
            ("llama.context_length", GG_U32, gg_value(GG_U32, 64)),
            ("llama.embedding_length", GG_U32, gg_value(GG_U32, h)),
            ("llama.block_count", GG_U32, gg_value(GG_U32, 1)),
            ("llama.feed_forward_length", GG_U32, gg_value(GG_U32, inter)),
            ("llama.attention.head_count", GG_U32, gg_value(GG_U32, heads)),
            ("llama.attention.head_count_kv", GG_U32, gg_value(GG_U32, kv)),
            ("llama.rope.dimension_count", GG_U32, gg_value(GG_U32, hd)),
            ("llama.attention.layer_norm_rms_epsilon", GG_F32, gg_value(GG_F32, 1e-5)),
            ("llama.vocab_size", GG_U32, gg_value(GG_U32, vocab))] + tok_kvs
    mats = [("token_embd.weight", [h, vocab]), ("blk.0.attn_q.weight", [h, h]),
            ("blk.0.attn_k.weight", [h, kv * hd]), ("blk.0.attn_v.weight", [h, kv * hd]),
            ("blk.0.attn_output.weight", [h, h]), ("blk.0.ffn_gate.weight", [h, inter]),
            ("blk.0.ffn_up.weight", [h, inter]), ("blk.0.ffn_down.weight", [inter, h])]
    tensors = []
    for i, (name, ne) in enumerate(mats):
        ty = types[i % len(types)]
        tensors.append((name, ty, ne, ggml_blocks(rng, ty, ne[0] * ne[1])))
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        tensors.append((name, "F32", [h], f32_bytes([1.0] * h)))
    return gguf(meta, tensors)


# --- main ------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qforge", default=os.path.join(ROOT, "build", "cli", "qforge"))
    args = ap.parse_args()
    shutil.rmtree(CORPUS, ignore_errors=True)
    rng = random.Random(14)

    # safetensors: the fixtures as they are (all under 1 KB), sharded as one framed input
    for f in ("dtypes.safetensors", "unsupported.safetensors"):
        put("safetensors", f, data("safetensors", f))
    put("safetensors", "sharded", frames(data("safetensors", "sharded", "model.safetensors.index.json"),
                                         data("safetensors", "sharded", "model-00001-of-00002.safetensors"),
                                         data("safetensors", "sharded", "model-00002-of-00002.safetensors")))
    put("safetensors", "metadata.safetensors",
        safetensors([("a", "BF16", [2, 3], bf16_bytes([1, 2, 3, 4, 5, 6])), ("b", "I64", [1], b"\0" * 8)],
                    {"format": "pt", "note": "x"}))

    # config.json: real configs (a few hundred bytes each) and the quantized checkpoints'
    for f in ("llama3.2_1b_instruct.json", "mistral_7b_v0.1.json", "qwen2_0.5b.json",
              "tinyllama_1.1b.json", "llama_rope_type_key.json", "mistral_defaults.json"):
        put("config_json", f, data("configs", f))
    put("config_json", "hf_llama3_rope", data("hf_models", "llama3_rope_tied", "config.json"))
    for case in ("gptq_4bit_asym_g32", "awq_4bit_g64"):
        put("config_json", case, data("quant_checkpoints", case, "config.json"))
    put("config_json", "gptq_8bit_quantize_config",
        frames(data("quant_checkpoints", "gptq_8bit_sym_g64", "config.json"),
               data("quant_checkpoints", "gptq_8bit_sym_g64", "quantize_config.json")))

    # tokenizer.json (+ tokenizer_config.json, generation_config.json): each family trimmed
    base_keep = {"gpt2": 256, "llama3": 256, "qwen2": 256, "smollm2": 259, "llama2": 330,
                 "llama2-metaspace": 330}
    trimmed = {}
    for fam, n in base_keep.items():
        tj, cfg = trim_tokenizer(fam, n, 60)
        trimmed[fam] = (tj, cfg)
        put("tokenizer_json", fam, frames(jdump(tj), jdump(cfg)))
    put("tokenizer_json", "gpt2-alone", jdump(trimmed["gpt2"][0]))
    qwen_added = [a["id"] for a in trimmed["qwen2"][0]["added_tokens"]]
    put("tokenizer_json", "qwen2-generation-config",
        frames(jdump(trimmed["qwen2"][0]), jdump(trimmed["qwen2"][1]),
               jdump({"bos_token_id": qwen_added[0], "eos_token_id": qwen_added[1:3]})))

    # llama2.c vocabulary and checkpoints
    put("llama2c_vocab", "tok512.bin", data("quant_checkpoints", "tok512.bin"))
    put("llama2c_vocab", "tok270.bin", llama2c_vocab(270))  # 259 is the least it accepts
    put("llama2c", "tied_v264", frames(llama2c_checkpoint(rng, 8, 16, 1, 2, 1, 264, 8),
                                       llama2c_vocab(264)))
    put("llama2c", "untied_gqa_v16", llama2c_checkpoint(rng, 8, 8, 2, 2, 1, 16, 4, shared=False))
    put("llama2c", "ak42_magic", struct.pack("<Ii", 0x616b3432, 1) + b"\0" * 248)

    # HF import: tiny float and GPTQ/AWQ checkpoints (hidden 32, 4 heads of 8, 2 KV heads)
    cf = tiny_config(8, 2, 1, 8, 16)
    put("hf_import", "float_f32", frames(jdump(cf), safetensors(float_model(cf, rng, "F32"))))
    cq = tiny_config(8, 2, 1, 8, 16, tied=False, arch="qwen2",
                     extra={"architectures": ["Qwen2ForCausalLM"], "torch_dtype": "bfloat16"})
    put("hf_import", "qwen2_bf16_untied", frames(jdump(cq), safetensors(float_model(cq, rng, "BF16"))))
    qcfgs = {
        "gptq_4bit_asym_g32": ({"bits": 4, "group_size": 32, "sym": False, "desc_act": False,
                                "quant_method": "gptq", "checkpoint_format": "gptq"}, 4, 32, False),
        "gptq_4bit_sym_gm1": ({"bits": 4, "group_size": -1, "sym": True, "desc_act": False,
                               "quant_method": "gptq", "checkpoint_format": "gptq"}, 4, -1, False),
        "awq_4bit_g32": ({"bits": 4, "group_size": 32, "quant_method": "awq", "version": "gemm",
                          "zero_point": True}, 4, 32, True),
    }
    for name, (qc, bits, group, awq) in qcfgs.items():
        c = tiny_config(32, 4, 2, 32, 32, extra={"quantization_config": qc})
        put("hf_import", name, frames(jdump(c), safetensors(gptq_model(c, rng, bits, group, awq))))
    c8 = tiny_config(32, 4, 2, 32, 32)
    q8 = {"bits": 8, "group_size": 32, "sym": True, "desc_act": False, "quant_method": "gptq",
          "checkpoint_format": "gptq"}
    put("hf_import", "gptq_8bit_quantize_config",
        frames(jdump(c8), safetensors(gptq_model(c8, rng, 8, 32)), jdump(q8)))

    # GGUF: tiny models with tiny_llama.gguf's tokenizer (metadata copied), and the dequant types
    kvs = read_gguf_kv(data("gguf", "tiny_llama.gguf"))
    tok_kvs = [kv for kv in kvs if kv[0].startswith("tokenizer.")]
    put("gguf", "tiny_q8_q4", tiny_gguf(rng, tok_kvs, ["Q8_0", "Q4_0", "F16"]))
    put("gguf", "tiny_q4_1_q5", tiny_gguf(rng, [kv for kv in tok_kvs if kv[0] != "tokenizer.chat_template"],
                                          ["Q4_1", "Q5_0", "Q5_1", "BF16"]))
    dq = []
    for ty in GGML:
        be = GGML[ty][1]
        dq.append((ty + ".blocks", ty, [max(be, 32)], ggml_blocks(rng, ty, max(be, 32))))
    put("gguf", "dequant_types", gguf([("general.architecture", GG_STR, gg_value(GG_STR, "llama"))], dq))
    put("gguf", "metadata_only", gguf(
        [("general.alignment", GG_U32, gg_value(GG_U32, 64)),
         ("a.i32", GG_I32, gg_value(GG_I32, -3)), ("a.bool", GG_BOOL, gg_value(GG_BOOL, 1)),
         ("a.arr", GG_ARR, gg_value(GG_ARR, (GG_U32, [1, 2, 3]))),
         ("a.strs", GG_ARR, gg_value(GG_ARR, (GG_STR, ["x", "y"])))], [], align=64))

    # zstd: u32 element count, then a frame (the zstd tool, with the content size recorded)
    def zstd(raw):  # from a file, so the frame records the content size
        with tempfile.NamedTemporaryFile() as f:
            f.write(raw)
            f.flush()
            return subprocess.run(["zstd", "-q", "-c", "-19", f.name], stdout=subprocess.PIPE,
                                  check=True).stdout
    for name, vals in (("ramp64", [float(i) for i in range(64)]), ("zeros256", [0.0] * 256),
                       ("random32", rand_vals(rng, 32))):
        put("zstd", name, struct.pack("<I", len(vals)) + zstd(f32_bytes(vals)))
    put("zstd", "declares_more", struct.pack("<I", 8) + zstd(f32_bytes([1.0] * 1024)))

    # calibration: a control byte (tokenizer, window), then text of the fixtures' own kinds
    texts = json.loads(data("tokenizers", "texts.json"))["texts"]
    inline = [t for t in texts if isinstance(t, dict) and "text" in t][:60]
    picks = [inline[i] for i in range(0, len(inline), max(1, len(inline) // 6))][:6]
    for i, t in enumerate(picks):
        body = (t["text"] + "\n") * 8
        put("calibration", "text%d" % i, bytes([i * 0x13 & 0xff]) + body.encode("utf-8", "replace"))
    put("calibration", "invalid_utf8", b"\x85" + b"caf\xc3\xa9 \xff\xfe \xed\xa0\x80 end. " * 20)

    # .qf: `qforge convert` of the tiny checkpoints, split into header JSON | data section
    if os.path.exists(args.qforge):
        with tempfile.TemporaryDirectory() as tmp:
            def qf_seed(name, model_dir_parts, extra_args, quantize=None):
                d = os.path.join(tmp, name)
                os.makedirs(d)
                for fname, content in model_dir_parts.items():
                    with open(os.path.join(d, fname), "wb") as f:
                        f.write(content)
                out = os.path.join(tmp, name + ".qf")
                subprocess.run([args.qforge, "convert", d, "-o", out] + extra_args, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                if quantize:
                    subprocess.run([args.qforge, "quantize", out, "-o", out + ".q"] + quantize,
                                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    out += ".q"
                raw = open(out, "rb").read()
                hoff, hlen, doff, dlen = struct.unpack_from("<QQQQ", raw, 16)
                put("qf", name, frames(raw[hoff:hoff + hlen], raw[doff:doff + dlen]))
                return raw
            cf2 = tiny_config(8, 2, 1, 8, 16)
            st = safetensors(float_model(cf2, rng, "F16"))
            qf_seed("f16_no_tokenizer", {"config.json": jdump(cf2), "model.safetensors": st}, [])
            qf_seed("f16_zstd", {"config.json": jdump(cf2), "model.safetensors": st}, ["--compress"])
            put("qf", "whole_file", open(os.path.join(tmp, "f16_no_tokenizer.qf"), "rb").read())
            cq4 = tiny_config(32, 4, 2, 32, 16)
            qf_seed("q4_q8", {"config.json": jdump(cq4),
                              "model.safetensors": safetensors(float_model(cq4, rng, "F16"))},
                    [], ["--qtype", "q4_g32", "--tensor-type", "mlp=q8_g32",
                         "--tensor-type", "embed=q4s_g32"])
            for fam in ("llama2", "gpt2"):
                tj, tc = trimmed[fam]
                ct = tiny_config(8, 2, 1, 8, len(tj["model"]["vocab"]) + len(
                    [a for a in tj["added_tokens"] if a["id"] >= len(tj["model"]["vocab"])]))
                qf_seed(fam + "_tokenizer", {"config.json": jdump(ct),
                                             "model.safetensors": safetensors(float_model(ct, rng, "F16")),
                                             "tokenizer.json": jdump(tj),
                                             "tokenizer_config.json": jdump(tc)}, ["--compress"])
    else:
        print("make_corpus: no qforge binary at %s: .qf seeds not written" % args.qforge)

    total = 0
    for dirpath, _, files in os.walk(CORPUS):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    print("make_corpus: %d bytes in %s" % (total, CORPUS))


if __name__ == "__main__":
    main()
