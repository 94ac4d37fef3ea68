#!/usr/bin/env python3
"""Reads the GGUF files that `qforge export --format gguf` wrote into tests/data/gguf/ with
llama.cpp's own Python package `gguf` (GGUFReader and its numpy dequantizers), the independent
reference, and writes what it read as JSON beside each file.

    python3 -m venv /work/venv-gguf
    /work/venv-gguf/bin/pip install gguf numpy xxhash
    # the exported files (tests/data/gguf/README.md gives the commands), then:
    /work/venv-gguf/bin/python scripts/make_gguf_export_fixtures.py

For each export_*.gguf, export_*.json holds: every metadata key with its type and value (arrays:
element type, length and every element; above 1024, the first elements and an xxh3-64 of their
compact JSON text), every
tensor's name, ggml type, shape (ne order) and byte count, and the xxh3-64 of its values as the
package dequantizes them to float32, in Hugging Face row order: for the "llama" architecture the
q/k rows are put back from llama.cpp's adjacent-pair RoPE order with the reshape written here
(convert_hf_to_gguf.py's LlamaModel.permute, inverted). tests/gguf_export_reference_test.cpp
compares them with qforge's reader and its dequantization of the same file.
"""
import json
from pathlib import Path

import gguf
import numpy as np
import xxhash
from gguf import GGUFReader, GGUFValueType

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "gguf"
VERSIONS = f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else '0.19.0'}, " \
           f"numpy {np.__version__}, xxhash {xxhash.VERSION}"
FIRST = 8  # elements listed of a tensor or of a long array
FULL_ARRAY = 1024  # arrays up to this length are listed whole


def value_of(field):
    v = field.contents()
    if isinstance(v, (bytes, bytearray)):
        v = v.decode("utf-8")
    return v


def metadata(reader):
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):  # the reader's own header pseudo-fields
            continue
        t = GGUFValueType(field.types[0])
        v = value_of(field)
        if t == GGUFValueType.ARRAY:
            el = GGUFValueType(field.types[1])
            if el == GGUFValueType.FLOAT32:
                v = [float(np.float32(x)) for x in v]
            out[name] = {"type": "ARRAY", "element_type": el.name, "length": len(v)}
            if len(v) <= FULL_ARRAY:
                out[name]["values"] = v
            else:
                text = json.dumps(v, ensure_ascii=False, separators=(",", ":"))
                out[name].update({"first": v[:FIRST],
                                  "xxh3_64": xxhash.xxh3_64_hexdigest(text.encode())})
        else:
            if t == GGUFValueType.FLOAT32:
                v = float(np.float32(v))
            out[name] = {"type": t.name, "value": v}
    return out


def unpermute(w, n_heads):
    """llama.cpp's adjacent-pair rows back to Hugging Face's rotate-half rows: in each head, row
    2i + j of the file is row j * head_dim / 2 + i."""
    rows = w.shape[0]
    head_dim = rows // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensors(reader, fields):
    if "general.architecture" not in fields:  # a tokenizer-only file
        return []
    arch = fields["general.architecture"]["value"]
    heads = fields[f"{arch}.attention.head_count"]["value"]
    kv_heads = fields.get(f"{arch}.attention.head_count_kv", {"value": heads})["value"]
    out = []
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        ne = [int(n) for n in t.shape]
        values = values.reshape(list(reversed(ne)))
        if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_k.weight")):
            values = unpermute(values, heads if "attn_q" in t.name else kv_heads)
        flat = np.ascontiguousarray(values).reshape(-1)
        out.append({"name": t.name, "type": t.tensor_type.name, "ne": ne,
                    "bytes": int(t.n_bytes),
                    "values_xxh3_64": xxhash.xxh3_64_hexdigest(flat.tobytes()),
                    "first": [float(x) for x in flat[:FIRST]]})
    return out


def main():
    for path in sorted(OUT.glob("export_*.gguf")):
        reader = GGUFReader(path)
        fields = metadata(reader)
        doc = {"generator": f"scripts/make_gguf_export_fixtures.py ({VERSIONS})",
               "file": path.name, "metadata": fields, "tensors": tensors(reader, fields)}
        path.with_suffix(".json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        print(f"{path.with_suffix('.json')}: {len(fields)} keys, {len(doc['tensors'])} tensors")


if __name__ == "__main__":
    main()
