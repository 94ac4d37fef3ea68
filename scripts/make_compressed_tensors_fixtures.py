#!/usr/bin/env python3
"""compressed-tensors fixtures and checks, with the PyPI compressed-tensors package as the
independent implementation of its "pack-quantized" format (sources/compressed_tensors.hpp).

    /work/venv/bin/python scripts/make_compressed_tensors_fixtures.py [OUT_DIR]
    /work/venv/bin/python scripts/make_compressed_tensors_fixtures.py --check-export QFORGE

The first form writes OUT_DIR/ct_<case>/ (default tests/data/quant_checkpoints): config.json
with the quantization_config compressed-tensors' own QuantizationConfig serializes,
model.safetensors with every linear of the fixtures' one-layer Llama (the float model of
make_quant_checkpoint_fixtures.py) quantized by compressed-tensors (calculate_qparams on each
group's min/max, then PackedQuantizationCompressor.compress), and reference.safetensors: float32
[out, in] per linear, PackedQuantizationCompressor.decompress of those parts with the scales
upcast to float32, so scale * (q - zero) is evaluated exactly. tests/compressed_tensors_test.cpp
checks that qforge's import dequantizes to exactly these weights. Needs torch, safetensors and
compressed-tensors (pip install compressed-tensors).

The second form runs QFORGE (a built qforge binary) in a temporary directory: the float model is
converted, RTN-quantized (every linear, the narrow ones too) to every type that maps (q4_g*, q4s_g*, q8, q8_g*), exported with
`qforge export --format compressed-tensors`, and also with `--format gptq`. compressed-tensors
decompresses the first; each weight must equal the GPTQ export's dequantization by its published
formula (W[o, i] = scales[g_idx[i], o] * (q[i, o] - (qzeros[g_idx[i], o] + 1))), which the C++
tests tie to qforge's own rows. transformers then loads the compressed-tensors export
(AutoModelForCausalLM with run_compressed False: decompressed on load) and every linear must equal the same weights
rounded once to the scales' float16. Asserts; prints one line per type.
"""
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                             QuantizationScheme, QuantizationStatus)
from compressed_tensors.quantization.utils import calculate_qparams

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_quant_checkpoint_fixtures as base  # noqa: E402  (the float model, numpy only)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "quant_checkpoints"

CASES = {
    # name: (num_bits, symmetric, strategy, group_size, scale dtype)
    "ct_4bit_asym_g32": (4, False, "group", 32, torch.float16),
    "ct_4bit_sym_g32_bf16": (4, True, "group", 32, torch.bfloat16),
    "ct_8bit_sym_channel": (8, True, "channel", None, torch.float16),
}
EXPORT_TYPES = ["q4_g32", "q4_g64", "q4_g128", "q4s_g32", "q4s_g64", "q4s_g128", "q8", "q8_g32",
                "q8_g128"]


def scheme_of(bits, sym, strategy, group):
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy=strategy,
                            group_size=group, observer="minmax")
    return QuantizationScheme(targets=["Linear"], weights=args)


def compress_linear(w, scheme, scale_dtype):
    """compressed-tensors' parts of one linear and its float32 decompression."""
    args = scheme.weights
    n, k = w.shape
    g = k if args.strategy == "channel" else args.group_size
    x = torch.from_numpy(w).float().reshape(n, k // g, g)
    scale, zp = calculate_qparams(x.amin(dim=2), x.amax(dim=2), args)
    scale = scale.to(scale_dtype)
    state = {"weight": torch.from_numpy(w).float(), "weight_scale": scale}
    if not args.symmetric:
        state["weight_zero_point"] = zp.to(torch.int8)
    parts = PackedQuantizationCompressor.compress(state, scheme)
    exact = dict(parts)
    exact["weight_scale"] = parts["weight_scale"].float()
    ref = PackedQuantizationCompressor.decompress(exact, scheme)["weight"]
    # In the file's own dtype the package rounds the product once: the same weights rounded.
    native = PackedQuantizationCompressor.decompress(dict(parts), scheme)["weight"]
    assert torch.equal(native, ref.to(scale_dtype)), "decompression is not the rounded product"
    return parts, ref.float()


def make_fixtures(out_dir):
    w = base.float_model()
    config = json.loads((base.SOURCE / "config.json").read_text())
    config.update({"num_hidden_layers": 1, "intermediate_size": base.INTERMEDIATE,
                   "vocab_size": base.VOCAB, "tie_word_embeddings": True, "dtype": "float16"})
    for case, (bits, sym, strategy, group, scale_dtype) in CASES.items():
        d = out_dir / case
        d.mkdir(parents=True, exist_ok=True)
        scheme = scheme_of(bits, sym, strategy, group)
        tensors = {name: torch.from_numpy(t.astype(np.float16)) for name, t in w.items()
                   if t.ndim == 1 or name == "model.embed_tokens.weight"}
        reference = {}
        for lin in base.LINEARS:
            name = "model.layers.0." + lin
            parts, ref = compress_linear(w[name + ".weight"], scheme, scale_dtype)
            for part, t in parts.items():
                tensors[name + "." + part] = t.contiguous()
            reference[name + ".weight"] = ref.contiguous()
        qc = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                                quantization_status=QuantizationStatus.COMPRESSED,
                                ignore=["lm_head"])
        cfg = dict(config)
        cfg["quantization_config"] = qc.model_dump(mode="json")
        (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        save_file(reference, str(d / "reference.safetensors"))
        print(f"{case}: {len(tensors)} tensors")


def gptq_dequant(d, name, n, k):
    """The GPTQ v1 export's weights by the published formula, float32 [n, k]."""
    t = load_file(str(d / "model.safetensors"))
    qweight = t[name + ".qweight"].numpy().view(np.uint32)
    qzeros = t[name + ".qzeros"].numpy().view(np.uint32)
    scales = t[name + ".scales"].numpy().astype(np.float32)
    g_idx = t[name + ".g_idx"].numpy()
    bits = 32 * qweight.shape[0] // k
    per, mask = 32 // bits, (1 << bits) - 1
    i = np.arange(k)
    q = (qweight[i // per, :] >> (bits * (i % per))[:, None]) & mask  # [k, n]
    o = np.arange(n)
    z = ((qzeros[:, o // per] >> (bits * (o % per))[None, :]) & mask) + 1  # [groups, n]
    w = scales[g_idx, :] * (q.astype(np.float32) - z[g_idx, :].astype(np.float32))
    return w.T.copy()


def check_export(qforge):
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig
    w = base.float_model()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "float"
        src.mkdir()
        shutil.copyfile(FIXTURES / "tok512.bin", tmp / "tok512.bin")
        cfg = json.loads((FIXTURES / "ct_4bit_asym_g32" / "config.json").read_text())
        del cfg["quantization_config"]
        (src / "config.json").write_text(json.dumps(cfg))
        save_file({n: torch.from_numpy(t.astype(np.float16)) for n, t in w.items()},
                  str(src / "model.safetensors"))
        run = lambda *a: subprocess.run([qforge, *a], check=True, capture_output=True, text=True)
        run("convert", str(src), "-o", str(tmp / "float.qf"))
        for qtype in EXPORT_TYPES:
            qf = tmp / f"{qtype}.qf"
            run("quantize", str(tmp / "float.qf"), "-o", str(qf), "--qtype", qtype, "--method",
                "rtn", "--tensor-type", "^embed$=f16", "--tensor-type", f"layers={qtype}")
            ct, gptq = tmp / f"{qtype}_ct", tmp / f"{qtype}_gptq"
            run("export", str(qf), "--format", "compressed-tensors", "-o", str(ct))
            run("export", str(qf), "--format", "gptq", "-o", str(gptq))
            qc = QuantizationConfig.model_validate(
                json.loads((ct / "config.json").read_text())["quantization_config"])
            scheme = qc.config_groups["group_0"]
            parts = load_file(str(ct / "model.safetensors"))
            # Decompressed on load (run_compressed keeps CompressedLinear modules, whose
            # asymmetric zero points transformers 5.24 sizes unpacked and refuses).
            model = AutoModelForCausalLM.from_pretrained(
                str(ct), dtype=torch.float16,
                quantization_config=CompressedTensorsConfig(run_compressed=False))
            sd = model.state_dict()
            for lin in base.LINEARS:
                name = "model.layers.0." + lin
                state = {p: parts[f"{name}.{p}"] for p in
                         ["weight_packed", "weight_scale", "weight_zero_point", "weight_shape"]
                         if f"{name}.{p}" in parts}
                state["weight_scale"] = state["weight_scale"].float()
                ref = PackedQuantizationCompressor.decompress(state, scheme)["weight"].float()
                n, k = ref.shape
                expected = torch.from_numpy(gptq_dequant(gptq, name, n, k))
                assert torch.equal(ref, expected), f"{qtype} {name}: decompression differs"
                loaded = sd[name + ".weight"]
                assert torch.equal(loaded, expected.half()), f"{qtype} {name}: transformers"
            print(f"{qtype}: group {scheme.weights.group_size} ({scheme.weights.strategy}), "
                  f"{len(base.LINEARS)} linears equal; transformers loads it")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--check-export":
        check_export(sys.argv[2])
        return
    make_fixtures(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES)


if __name__ == "__main__":
    main()
