#!/usr/bin/env python3
"""Writes a synthetic Hugging Face Llama checkpoint (config.json + safetensors) of a real model's
shapes with random finite f16 weights, for measuring conversion, quantization and inference speed
at real sizes without downloading the model.

    scripts/make_synthetic_checkpoint.py [OUT_DIR] [--shape tinyllama|smollm2] [--layers N]
                                         [--shards S] [--seed 0]

Shapes (config.json as published, torch_dtype f16 here):
  tinyllama  TinyLlama-1.1B: hidden 2048, 22 layers, 32 heads, 4 KV heads, intermediate 5632,
             vocab 32000, untied lm_head. 1.10B parameters, 2.2 GB in f16.
  smollm2    SmolLM2-135M: hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate 1536,
             vocab 49152, tied embeddings. 135M parameters, 270 MB in f16.
OUT_DIR defaults to models/synthetic-<shape> (git-ignored). --layers keeps only the first N
layers (default: all); `--shape tinyllama --layers 10` is the 571M-parameter, 1.14 GB checkpoint
with a largest tensor of 131 MB used to measure conversion memory. --shards defaults to 2 for
tinyllama, 1 for smollm2.

Weights: each f16 gets a random sign, mantissa and one of four exponents, so magnitudes are
spread log-uniformly over [2^-7, 2^-3) (about 0.008 to 0.125, typical 0.03, near the
1/sqrt(hidden) scale of trained matrices), which keeps activations finite through every layer.
Norm weights are 1. Standard library only; streams tensor by tensor; the same seed gives the
same bytes.
"""
import argparse
import json
import os
import random
import struct

SHAPES = {
    "tinyllama": dict(hidden=2048, intermediate=5632, heads=32, kv_heads=4, vocab=32000, layers=22,
                      tied=False, max_positions=2048, rope_theta=10000.0, bos=1, eos=2, shards=2),
    "smollm2": dict(hidden=576, intermediate=1536, heads=9, kv_heads=3, vocab=49152, layers=30,
                    tied=True, max_positions=8192, rope_theta=100000.0, bos=0, eos=0, shards=1),
}


def tensors(shape, layers):
    h, i, hd = shape["hidden"], shape["intermediate"], shape["hidden"] // shape["heads"]
    kv = shape["kv_heads"] * hd
    yield "model.embed_tokens.weight", [shape["vocab"], h]
    for n in range(layers):
        p = f"model.layers.{n}."
        yield p + "input_layernorm.weight", [h]
        yield p + "self_attn.q_proj.weight", [h, h]
        yield p + "self_attn.k_proj.weight", [kv, h]
        yield p + "self_attn.v_proj.weight", [kv, h]
        yield p + "self_attn.o_proj.weight", [h, h]
        yield p + "post_attention_layernorm.weight", [h]
        yield p + "mlp.gate_proj.weight", [i, h]
        yield p + "mlp.up_proj.weight", [i, h]
        yield p + "mlp.down_proj.weight", [h, i]
    yield "model.norm.weight", [h]
    if not shape["tied"]:
        yield "lm_head.weight", [shape["vocab"], h]


# The high byte of a little-endian f16 is s eeeee mm. Keep the sign and the two mantissa bits,
# and map the exponent to one of 8..11 (2^-7 .. 2^-4 times 1.mantissa).
SCALED_HIGH_BYTE = bytes((b & 0x83) | ((8 + ((b >> 2) & 3)) << 2) for b in range(256))
F16_ONE = struct.pack("<e", 1.0)


def count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def random_f16(rng, n):
    data = bytearray(rng.randbytes(2 * n))
    data[1::2] = data[1::2].translate(SCALED_HIGH_BYTE)
    return data


def write_shard(path, entries, rng):
    header, offset = {}, 0
    for name, shape in entries:
        size = 2 * count(shape)
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape in entries:
            n = count(shape)
            f.write(F16_ONE * n if len(shape) == 1 else random_f16(rng, n))
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", help="output folder (default: models/synthetic-<shape>)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama")
    ap.add_argument("--layers", type=int, help="keep the first N layers (default: all)")
    ap.add_argument("--shards", type=int, help="safetensors files (default: 2 tinyllama, 1 smollm2)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    layers = shape["layers"] if args.layers is None else args.layers
    if not 1 <= layers <= shape["layers"]:
        ap.error(f"--layers must be between 1 and {shape['layers']} for {args.shape}")
    shards = shape["shards"] if args.shards is None else args.shards
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models",
                                   f"synthetic-{args.shape}")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(args.seed)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": shape["hidden"], "intermediate_size": shape["intermediate"],
        "num_hidden_layers": layers, "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"], "vocab_size": shape["vocab"],
        "max_position_embeddings": shape["max_positions"], "rms_norm_eps": 1e-5,
        "rope_theta": shape["rope_theta"], "hidden_act": "silu",
        "tie_word_embeddings": shape["tied"], "bos_token_id": shape["bos"],
        "eos_token_id": shape["eos"], "torch_dtype": "float16",
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    entries = list(tensors(shape, layers))
    if shards <= 1:
        write_shard(os.path.join(out, "model.safetensors"), entries, rng)
    else:
        per = (len(entries) + shards - 1) // shards
        weight_map = {}
        for s in range(shards):
            name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = entries[s * per:(s + 1) * per]
            write_shard(os.path.join(out, name), part, rng)
            weight_map.update({t: name for t, _ in part})
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    params = sum(count(s) for _, s in entries)
    print(f"wrote {os.path.normpath(out)}: {args.shape} shape, {layers} layers, "
          f"{params / 1e6:.1f}M parameters, {2 * params / 1e9:.2f} GB f16")


if __name__ == "__main__":
    main()
