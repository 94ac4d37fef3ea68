#!/usr/bin/env python3
"""Reference logits of Gemma 3 270M (gemma-3-270m-q4_k_m.gguf, scripts/get_models.sh gemma3):
transformers reads the GGUF itself (AutoModelForCausalLM.from_pretrained(dir, gguf_file=...):
its own dequantization of the Q4_K/Q6_K/Q8_0 tensors, the norms' stored 1 + w turned back
into w, Gemma3TextConfig's defaults for what the file lacks: local RoPE base 10,000, five local
layers to one global, query scale 256^-1/2) and runs it in float32 with eager attention. The
test converts the same GGUF with qforge and compares.

    /work/venv/bin/python scripts/make_gemma3_logits_fixture.py models/gemma-3-270m-q4_k_m.gguf

Writes tests/data/gguf/gemma3_270m_logits.gguf, read back with qforge's own GGUF reader, two
inputs in the format of smollm2_135m_logits.gguf (scripts/make_gguf_logits_fixtures.py):
  chat.*  the Gemma 3 chat prompt of "What is the capital of France?" (ids "chat-user" of
          gemma3_270m.json)
  long.*  640 tokens, past the local layers' 512-token window: BOS, then the ids of the inline
          fixture texts of gemma3_270m.json one after another (text written for the fixtures,
          not the shared corpus)
each with "<name>.logits" F32 [positions, samples] at qforge.<name>.positions and the vocabulary
ids qforge.<name>.sample_ids (seeded random ids, the control tokens and every position's
argmax), and qforge.<name>.argmax per position.
"""
import argparse
import json
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "gguf"
LONG = 640


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", type=Path)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name,
                                                 dtype=torch.float32, attn_implementation="eager")
    model.eval()
    c = model.config
    print("config:", {k: getattr(c, k, None) for k in (
        "model_type", "hidden_size", "num_hidden_layers", "head_dim", "num_attention_heads",
        "num_key_value_heads", "sliding_window", "rope_theta", "rope_local_base_freq",
        "query_pre_attn_scalar", "layer_types", "rope_scaling", "rope_parameters",
        "final_logit_softcapping", "attn_logit_softcapping", "hidden_activation",
        "tie_word_embeddings")})

    ref = json.loads((OUT / "gemma3_270m.json").read_text())
    long_ids = [2]
    for name in sorted(ref["ids"]):
        long_ids += ref["ids"][name][1:]  # without each text's BOS
    assert len(long_ids) >= LONG, len(long_ids)
    inputs = {"chat": ref["chat"]["chat-user"]["ids"], "long": long_ids[:LONG]}

    w = gguf.GGUFWriter(str(OUT / "gemma3_270m_logits.gguf"), arch="qforge-reference-logits")
    w.add_string("qforge.generator", f"scripts/make_gemma3_logits_fixture.py (torch "
                                      f"{torch.__version__}, transformers {transformers.__version__})")
    rng = np.random.default_rng(7)
    for name, ids in inputs.items():
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float32)
        argmax = logits.argmax(axis=1)
        step = 5 if name == "chat" else 16
        positions = sorted(set(range(0, len(ids), step)) | {len(ids) - 1} |
                           ({509, 510, 511, 512, 513, 514} if len(ids) > 514 else set()))
        sample = set(rng.choice(logits.shape[1], 200, replace=False).tolist())
        sample |= set(range(8)) | {105, 106} | set(argmax[positions].tolist())
        sample = sorted(sample)
        w.add_array(f"qforge.{name}.input_ids", [int(x) for x in ids])
        w.add_array(f"qforge.{name}.positions", positions)
        w.add_array(f"qforge.{name}.sample_ids", sample)
        w.add_array(f"qforge.{name}.argmax", [int(x) for x in argmax[positions]])
        w.add_tensor(f"{name}.logits", np.ascontiguousarray(logits[positions][:, sample]))
        print(name, len(ids), "tokens; argmax at the last position:", int(argmax[-1]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", OUT / "gemma3_270m_logits.gguf")


if __name__ == "__main__":
    main()
