#!/usr/bin/env python3
"""Writes tiny GPTQ and AWQ Hugging Face checkpoints, packed with numpy straight from the published
formats, and the dequantized weights those formats define: the independent reference for qforge's
GPTQ/AWQ import (tests/hf_quantized_import_test.cpp).

    /work/venv-gguf/bin/python scripts/make_quant_checkpoint_fixtures.py TOK512_BIN [OUT_DIR]

TOK512_BIN is a 512-token llama2.c vocabulary, the one scripts/make_llama2c_vocab.py learns on
docs/FORMAT.md (never ../shared's: nothing of ../shared is copied into the repository); it is
copied to OUT_DIR (default tests/data/quant_checkpoints), where the converter finds it for every case (a
tok*.bin in the folder above the checkpoint). Needs only numpy: safetensors files are written by
hand (8-byte header length, JSON header, data), as the format specifies.

The float model is tests/data/hf_models/llama_gqa_untied (hidden 32, 4 query heads of 8, 2 KV
heads) cut to one layer, with its intermediate size widened from 86 (not a whole number of
8-code words) to 128 by seeded random rows/columns of the same spread, its vocabulary tiled from
256 to 512 rows to match tok512.bin, and the embedding tied and stored as F16, as GPTQ/AWQ
checkpoints keep it. Its seven linears are round-to-nearest quantized per group and packed:

  GPTQ v1 (AutoGPTQ, checkpoint_format "gptq"): qweight int32 [in / (32/b), out], code of input
  i in bits b * (i % (32/b)) of word i // (32/b); qzeros int32 [groups, out / (32/b)], zero - 1
  packed along the output; scales fp16 [groups, out]; g_idx int32 [in].
  W[o, i] = scales[g_idx[i], o] * (q[i, o] - (zeros[g_idx[i], o] + 1)).
  Grid (GPTQ's quantizer): asym range [min(0, lo), max(0, hi)], scale = range / maxq,
  zero = round(-lo / scale); sym scale = 2 max|w| / maxq, zero = (maxq + 1) / 2.

  AWQ GEMM (AutoAWQ, version "gemm"): qweight int32 [in, out / 8], nibble p of word w holding
  output 8 w + [0, 2, 4, 6, 1, 3, 5, 7][p]; qzeros int32 [groups, out / 8], true zeros, same
  order; scales fp16 [groups, out]. W[o, i] = scales[i // g, o] * (q[i, o] - z[i // g, o]).
  Grid (AutoAWQ's): scale = (hi - lo) / 15 (at least 1e-5), zero = clamp(-round(lo / scale)).

  GPTQ v2 (GPTQModel, checkpoint_format "gptq_v2"): as v1 with the true zeros in qzeros.

Scales are rounded to fp16 before the codes are chosen (they are what the file stores). The
reference is scale * (q - zero) in float32, exact (an 11-bit scale times an integer below 2^9).

Per case OUT_DIR/<case>/: config.json (with quantization_config, or a quantize_config.json
beside it), model.safetensors, reference.safetensors (float32 [out, in] per linear, under the
linear's X.weight name). Act-order cases (desc_act) quantize the columns in a random order
perm, in groups of g along it, and store g_idx[perm[j]] = j // g with each code at its input.
Deterministic: the same numpy gives the same bytes.
"""
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "data" / "hf_models" / "llama_gqa_untied"
SEED = 20261129
INTERMEDIATE = 128
VOCAB = 512
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]

CASES = {
    # name: (method, bits, group_size, sym, act_order, config beside in quantize_config.json)
    "gptq_4bit_asym_g32": ("gptq", 4, 32, False, False, False),
    "gptq_4bit_sym_g128": ("gptq", 4, 128, True, False, False),
    "gptq_4bit_asym_gm1": ("gptq", 4, -1, False, False, False),
    "gptq_8bit_sym_g64": ("gptq", 8, 64, True, False, True),
    "gptq_4bit_act_order": ("gptq", 4, 32, False, True, False),
    "awq_4bit_g64": ("awq", 4, 64, False, False, False),
    "gptq_4bit_asym_g32_v2": ("gptq", 4, 32, False, False, False),
    "gptq_4bit_sym_g128_v2_as_gptq": ("gptq", 4, 128, True, False, False),
    "gptq_4bit_sym_act_order": ("gptq", 4, 32, True, True, False),
}
# GPTQ v2 (GPTQModel's internal layout, checkpoint_format "gptq_v2"): qzeros hold the true zeros.
# name: the checkpoint_format written. The asymmetric case makes row 0 of q_proj non-negative, so
# its zero is 0, which v1 cannot store; the symmetric one stores v2 zeros (8) under v1's label, as
# some tools do: qforge reads the zeros, not the label.
V2_CASES = {"gptq_4bit_asym_g32_v2": "gptq_v2", "gptq_4bit_sym_g128_v2_as_gptq": "gptq"}

DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32"}


def read_safetensors(path):
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype="<f4").reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = np.ascontiguousarray(tensors[name])
        raw = t.astype(t.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def float_model():
    src = read_safetensors(SOURCE / "model.safetensors")
    rng = np.random.default_rng(SEED)
    p = "model.layers.0."
    w = {name: src[name].astype(np.float32) for name in src if name.startswith(p)}
    for name, axis in [("mlp.gate_proj", 0), ("mlp.up_proj", 0), ("mlp.down_proj", 1)]:
        t = w[p + name + ".weight"]
        extra_shape = list(t.shape)
        extra_shape[axis] = INTERMEDIATE - t.shape[axis]
        extra = rng.normal(0.0, float(t.std()), size=extra_shape).astype(np.float32)
        w[p + name + ".weight"] = np.concatenate([t, extra], axis=axis)
    embed = np.concatenate([src["model.embed_tokens.weight"]] * (VOCAB // 256), axis=0)
    w["model.embed_tokens.weight"] = embed
    w["model.norm.weight"] = src["model.norm.weight"]
    return w


def group_bounds(k, group):
    g = k if group == -1 else group
    return [(s, min(s + g, k)) for s in range(0, k, g)]


def rtn(w, bits, group, sym, awq):
    """Codes q [out, in] (0 .. 2^bits - 1), scales fp16 [groups, out], zeros int [groups, out]."""
    n, k = w.shape
    maxq = 2 ** bits - 1
    bounds = group_bounds(k, group)
    q = np.zeros((n, k), dtype=np.int64)
    scales = np.zeros((len(bounds), n), dtype=np.float16)
    zeros = np.zeros((len(bounds), n), dtype=np.int64)
    for g, (s, e) in enumerate(bounds):
        x = w[:, s:e].astype(np.float32)
        lo, hi = x.min(axis=1), x.max(axis=1)
        if awq:
            scale = np.maximum((hi - lo) / maxq, 1e-5).astype(np.float16)
            zero = np.clip(-np.rint(lo / scale.astype(np.float32)), 0, maxq)
        elif sym:
            amax = np.maximum(np.abs(lo), hi)
            scale = (2 * amax / maxq).astype(np.float16)
            zero = np.full(n, (maxq + 1) // 2)
        else:
            lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
            scale = ((hi - lo) / maxq).astype(np.float16)
            zero = np.rint(-lo / scale.astype(np.float32))
        assert np.all(scale != 0) and np.all(np.isfinite(scale))
        s32 = scale.astype(np.float32)[:, None]
        q[:, s:e] = np.clip(np.rint(x / s32) + zero[:, None], 0, maxq)
        scales[g] = scale
        zeros[g] = zero
    return q, scales, zeros


def dequantize(q, scales, zeros, k, group):
    """The format's formula, per weight, in float32 (exact)."""
    n = q.shape[0]
    out = np.zeros((n, k), dtype=np.float32)
    for g, (s, e) in enumerate(group_bounds(k, group)):
        out[:, s:e] = (scales[g].astype(np.float32)[:, None] *
                       (q[:, s:e] - zeros[g][:, None]).astype(np.float32))
    return out


def pack_gptq(q, scales, zeros, bits, group, act_order_perm, v2=False):
    n, k = q.shape
    per = 32 // bits
    mask = 2 ** bits - 1
    qt = q.T.astype(np.uint32)  # [in, out]
    qweight = np.zeros((k // per, n), dtype=np.uint32)
    for j in range(per):
        qweight |= (qt[j::per] & mask) << np.uint32(bits * j)
    if v2:
        stored = zeros & mask  # v2 stores the zero itself
    else:
        stored = (zeros - 1) & mask  # v1 stores zero - 1
        assert np.all(zeros >= 1), "a zero of 0 would wrap to 16 in GPTQ v1"
    qzeros = np.zeros((zeros.shape[0], n // per), dtype=np.uint32)
    for j in range(per):
        qzeros |= stored[:, j::per].astype(np.uint32) << np.uint32(bits * j)
    g = k if group == -1 else group
    g_idx = np.arange(k, dtype=np.int32) // g
    if act_order_perm is not None:
        # desc_act: input perm[j] is in group j // g.
        g_idx = np.zeros(k, dtype=np.int32)
        g_idx[act_order_perm] = np.arange(k, dtype=np.int32) // g
    return {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32),
            "scales": scales, "g_idx": g_idx}


def pack_awq(q, scales, zeros):
    n, k = q.shape
    qt = q.T.astype(np.uint32)  # [in, out]
    qweight = np.zeros((k, n // 8), dtype=np.uint32)
    qzeros = np.zeros((zeros.shape[0], n // 8), dtype=np.uint32)
    z = zeros.astype(np.uint32)
    for p, col in enumerate(AWQ_ORDER):
        qweight |= qt[:, col::8] << np.uint32(4 * p)
        qzeros |= z[:, col::8] << np.uint32(4 * p)
    return {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32), "scales": scales}


def quant_config(method, bits, group, sym, act_order, checkpoint_format="gptq"):
    if method == "awq":
        return {"quant_method": "awq", "bits": bits, "group_size": group, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": None}
    return {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order,
            "sym": sym, "checkpoint_format": checkpoint_format, "damp_percent": 0.01,
            "true_sequential": True, "static_groups": False}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    tokenizer = Path(sys.argv[1])
    out_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "tests" / "data" / "quant_checkpoints"
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer, out_dir / "tok512.bin")
    w = float_model()
    base_config = json.loads((SOURCE / "config.json").read_text())
    base_config.update({"num_hidden_layers": 1, "intermediate_size": INTERMEDIATE,
                        "vocab_size": VOCAB, "tie_word_embeddings": True, "dtype": "float16"})
    for case, (method, bits, group, sym, act_order, beside) in CASES.items():
        d = out_dir / case
        d.mkdir(exist_ok=True)
        for stale in ["quantize_config.json", "reference.safetensors"]:
            (d / stale).unlink(missing_ok=True)
        rng = np.random.default_rng(SEED + len(case))
        tensors = {name: t.astype(np.float16) for name, t in w.items() if t.ndim == 1}
        tensors["model.embed_tokens.weight"] = w["model.embed_tokens.weight"].astype(np.float16)
        reference = {}
        codes_seen = set()
        for lin in LINEARS:
            name = "model.layers.0." + lin
            x = w[name + ".weight"]
            if case in V2_CASES and not sym and lin == "self_attn.q_proj":
                x = x.copy()
                x[0] = np.abs(x[0])  # one group whose zero is 0
            perm = rng.permutation(x.shape[1]) if act_order else None
            if act_order:
                # desc_act: the columns are quantized in the order perm, groups of g in that
                # order, so input perm[j] lies in group j // g and its code sits at input perm[j].
                q_perm, scales, zeros = rtn(x[:, perm], bits, group, sym, False)
                q = np.empty_like(q_perm)
                q[:, perm] = q_perm
                g_idx = np.empty(x.shape[1], dtype=np.int64)
                g_idx[perm] = np.arange(x.shape[1]) // group
                # The published formula: W[:, i] = scale[g_idx[i]] * (q[:, i] - zero[g_idx[i]]).
                reference[name + ".weight"] = (scales[g_idx].T.astype(np.float32) *
                                               (q - zeros[g_idx].T).astype(np.float32))
            else:
                q, scales, zeros = rtn(x, bits, group, sym, method == "awq")
                reference[name + ".weight"] = dequantize(q, scales, zeros, x.shape[1], group)
            codes_seen.update(np.unique(q).tolist())
            if method == "awq":
                parts = pack_awq(q, scales, zeros)
            else:
                parts = pack_gptq(q, scales, zeros, bits, group, perm, v2=case in V2_CASES)
            for part, t in parts.items():
                tensors[name + "." + part] = t
        if bits == 8 and sym:
            assert 0 in codes_seen, "the 8-bit case must hold code 0 (int8 -128)"
        config = dict(base_config)
        qc = quant_config(method, bits, group, sym, act_order, V2_CASES.get(case, "gptq"))
        if beside:
            (d / "quantize_config.json").write_text(json.dumps(qc, indent=2, sort_keys=True) + "\n")
        else:
            config["quantization_config"] = qc
        (d / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        write_safetensors(d / "model.safetensors", tensors)
        write_safetensors(d / "reference.safetensors", reference)
        print(f"{case}: {len(tensors)} tensors, codes {min(codes_seen)}..{max(codes_seen)}")


if __name__ == "__main__":
    main()
