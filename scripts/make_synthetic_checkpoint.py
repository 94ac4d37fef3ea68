#!/usr/bin/env python3
"""Writes a synthetic Hugging Face Llama checkpoint (config.json + safetensors) of real shapes
with random finite f16 weights, for measuring conversion memory and speed on large inputs.

    scripts/make_synthetic_checkpoint.py OUT_DIR [--layers 10] [--shards 2] [--seed 0]

The default (TinyLlama-1.1B shapes, 10 of its 22 layers, untied lm_head) is 571M parameters,
1.14 GB in f16, with a largest tensor of 131 MB. Standard library only; streams tensor by tensor.
"""
import argparse
import json
import os
import random
import struct

SHAPE = dict(hidden=2048, intermediate=5632, heads=32, kv_heads=4, vocab=32000)


def tensors(layers):
    h, i, hd = SHAPE["hidden"], SHAPE["intermediate"], SHAPE["hidden"] // SHAPE["heads"]
    kv = SHAPE["kv_heads"] * hd
    yield "model.embed_tokens.weight", [SHAPE["vocab"], h]
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
    yield "lm_head.weight", [SHAPE["vocab"], h]


# Clearing the top exponent bit of each f16 keeps every value finite (|x| < 2).
FINITE = bytes(b & 0xBF for b in range(256))


def random_f16(rng, count):
    data = bytearray(rng.randbytes(2 * count))
    data[1::2] = data[1::2].translate(FINITE)
    return data


def write_shard(path, entries, rng):
    header, offset = {}, 0
    for name, shape in entries:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape in entries:
            n = 1
            for d in shape:
                n *= d
            f.write(random_f16(rng, n))
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": SHAPE["hidden"], "intermediate_size": SHAPE["intermediate"],
        "num_hidden_layers": args.layers, "num_attention_heads": SHAPE["heads"],
        "num_key_value_heads": SHAPE["kv_heads"], "vocab_size": SHAPE["vocab"],
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "float16",
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    entries = list(tensors(args.layers))
    if args.shards <= 1:
        write_shard(os.path.join(args.out, "model.safetensors"), entries, rng)
        return
    per = (len(entries) + args.shards - 1) // args.shards
    weight_map = {}
    for s in range(args.shards):
        name = f"model-{s + 1:05d}-of-{args.shards:05d}.safetensors"
        part = entries[s * per:(s + 1) * per]
        write_shard(os.path.join(args.out, name), part, rng)
        weight_map.update({t: name for t, _ in part})
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    main()
