#!/usr/bin/env python3
"""Writes the safetensors fixtures under tests/data/safetensors/ with the independent PyPI
`safetensors` package, so tests/safetensors_test.cpp checks our reader against another
implementation rather than against our own writer.

The fixture files are committed; rerun this only to change them. The outputs are deterministic
(fixed values, no randomness), so a rerun with the same package versions gives identical bytes.

    python3 -m venv /work/venv-st && /work/venv-st/bin/pip install safetensors numpy
    /work/venv-st/bin/python scripts/make_safetensors_fixtures.py

Made with safetensors 0.8.0 and numpy 2.4.6.

Files written:
  dtypes.safetensors        every dtype we support, odd shapes, a 0-d scalar, a zero-size tensor,
                            a non-ASCII name and __metadata__
  dtypes.expected.json      for each tensor: dtype, shape, little-endian bytes as hex, and the
                            values as JSON numbers (as numpy sees them)
  unsupported.safetensors   a valid file holding F64 and BOOL tensors (we refuse those dtypes)
  sharded/                  a 2-shard checkpoint with model.safetensors.index.json written the
                            way transformers writes it (indent=2, sort_keys=True, trailing "\\n")
  sharded.expected.json     tensor -> shard file, dtype, shape, hex
"""

import json
import os
import sys

import numpy as np
import safetensors
from safetensors import TensorSpec, serialize
from safetensors.numpy import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "safetensors")


def bf16_from_f32(values):
    """numpy has no bfloat16: keep the top 16 bits of f32 values that are exact in bf16."""
    f = np.asarray(values, dtype=np.float32)
    bits = f.view(np.uint32)
    assert np.all(bits & 0xFFFF == 0), "bf16 fixture values must be exactly representable"
    return (bits >> 16).astype("<u2")


def save_with_bf16(path, arrays, bf16, metadata):
    """save_file cannot take bf16 from numpy; go through the package's raw serialize()."""
    keep_alive = []
    specs = {}
    for name, a in arrays.items():
        a = np.require(a, requirements="C")  # ascontiguousarray would turn a 0-d scalar into 1-d
        keep_alive.append(a)
        specs[name] = TensorSpec(dtype=a.dtype.name, shape=list(a.shape), data_ptr=a.ctypes.data,
                                 data_len=a.nbytes)
    for name, (bits, shape) in bf16.items():
        keep_alive.append(bits)
        specs[name] = TensorSpec(dtype="bfloat16", shape=shape, data_ptr=bits.ctypes.data,
                                 data_len=bits.nbytes)
    with open(path, "wb") as f:
        f.write(bytes(serialize(specs, metadata=metadata)))


def expected_entry(dtype, shape, raw_le, values):
    return {"dtype": dtype, "shape": list(shape), "hex": raw_le.hex(), "values": values}


def make_dtypes():
    arrays = {
        "f32.odd": (np.arange(15, dtype=np.float32).reshape(3, 5) * 0.25 - 1.0),
        # Largest half, negative zero, the smallest subnormal, 1/3 rounded, a negative value.
        "f16.vec": np.array([65504.0, -0.0, 2.0**-24, 1.0 / 3.0, -7.5, 0.1, 1.0], dtype=np.float16),
        "i8.cube": np.array([-128, 127, 0, -1, 5, 42], dtype=np.int8).reshape(2, 3, 1),
        "u8.row": np.array([[0, 1, 128, 254, 255]], dtype=np.uint8),
        "i32.col": np.array([-(2**31), 2**31 - 1, 0, -7], dtype=np.int32).reshape(4, 1),
        "i64.big": np.array([-(2**63), 2**63 - 1, 1], dtype=np.int64),
        "scalar": np.array(42.5, dtype=np.float32),
        "empty": np.zeros((4, 0, 3), dtype=np.float32),
        "naïve.ü": np.array([7, 9], dtype=np.uint8),
    }
    bf16_values = [1.5, -2.25, 3.0, 0.0, -1024.0, 2.0**-10]
    bf16 = {"bf16.mat": (bf16_from_f32(bf16_values), [2, 3])}
    # One key only: the Rust writer keeps metadata in a HashMap, so with several keys their order
    # in the header (and the file's bytes) would change from run to run.
    metadata = {"format": "pt"}
    save_with_bf16(os.path.join(OUT, "dtypes.safetensors"), arrays, bf16, metadata)

    names = {np.float32: "F32", np.float16: "F16", np.int8: "I8", np.uint8: "U8",
             np.int32: "I32", np.int64: "I64"}
    expected = {}
    for name, a in arrays.items():
        le = a.astype(a.dtype.newbyteorder("<"))
        values = [float(v) if a.dtype.kind == "f" else int(v) for v in a.reshape(-1)]
        expected[name] = expected_entry(names[a.dtype.type], a.shape, le.tobytes(), values)
    bits, shape = bf16["bf16.mat"]
    expected["bf16.mat"] = expected_entry("BF16", shape, bits.tobytes(), bf16_values)
    write_json(os.path.join(OUT, "dtypes.expected.json"),
               {"metadata": metadata, "tensors": expected})


def make_unsupported():
    save_file({"f64": np.array([1.0, 2.0]), "mask": np.array([True, False, True])},
              os.path.join(OUT, "unsupported.safetensors"))


def make_sharded():
    # A tiny Llama-like layout split across two shards the way transformers' save_pretrained does.
    shards = {
        "model-00001-of-00002.safetensors": {
            "model.embed_tokens.weight": np.arange(24, dtype=np.float32).reshape(6, 4) / 8,
            "model.layers.0.input_layernorm.weight": np.ones(4, dtype=np.float16),
        },
        "model-00002-of-00002.safetensors": {
            "model.layers.0.mlp.down_proj.weight": np.arange(12, dtype=np.float16).reshape(4, 3),
            "model.norm.weight": np.full(4, 0.5, dtype=np.float32),
            "lm_head.weight": -np.arange(24, dtype=np.float32).reshape(6, 4),
        },
    }
    directory = os.path.join(OUT, "sharded")
    os.makedirs(directory, exist_ok=True)
    weight_map, expected, total = {}, {}, 0
    for shard, tensors in shards.items():
        save_file(tensors, os.path.join(directory, shard), metadata={"format": "pt"})
        for name, a in tensors.items():
            weight_map[name] = shard
            total += a.nbytes
            dtype = "F32" if a.dtype == np.float32 else "F16"
            expected[name] = {"file": shard, "dtype": dtype, "shape": list(a.shape),
                              "hex": a.astype(a.dtype.newbyteorder("<")).tobytes().hex()}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(directory, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")  # as transformers writes it
    write_json(os.path.join(OUT, "sharded.expected.json"), {"total_size": total, "tensors": expected})


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    make_dtypes()
    make_unsupported()
    make_sharded()
    for root, _, files in os.walk(OUT):
        for name in sorted(files):
            path = os.path.join(root, name)
            size = os.path.getsize(path)
            assert size < 20_000, f"{path} is {size} bytes; fixtures stay small"
    print(f"wrote fixtures to {os.path.normpath(OUT)} (safetensors {safetensors.__version__})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
