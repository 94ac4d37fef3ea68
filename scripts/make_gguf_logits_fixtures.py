#!/usr/bin/env python3
"""Reference logits for GGUF models: each model's weights dequantized by llama.cpp's `gguf`
package, q/k rows put back in Hugging Face order (the inverse of convert_hf_to_gguf.py's
LlamaModel.permute, written here), loaded into transformers' LlamaForCausalLM and run in
float32 (eager attention). The tests convert the same GGUF with qforge and compare.

Run by hand, not in CI (torch is several GB), with torch, transformers and gguf importable:

    /work/venv-torch/bin/pip install gguf        # or put gguf on PYTHONPATH
    /work/venv-torch/bin/python scripts/make_gguf_logits_fixtures.py \\
        [--smollm2 models/SmolLM2-135M-Instruct.Q4_1.gguf]

Writes to tests/data/gguf/ (GGUF files, read back with qforge's own reader):
  tiny_llama_logits.gguf   "logits" F32 [positions, vocab] of tiny_llama.gguf for the ids in
                           metadata qforge.input_ids
  smollm2_135m_logits.gguf (with --smollm2) "logits" F32 [positions, samples]: the logits of
                           SmolLM2-135M-Instruct (dequantized Q4_1) at the positions
                           qforge.positions (every fifth and the last) and the vocabulary ids
                           qforge.sample_ids (seeded random ids, the special tokens and every
                           position's argmax), qforge.argmax per position, for the chat prompt
                           whose ids are qforge.input_ids. A full row is 49152 floats; a sample
                           keeps the fixture small while a wrong weight still moves it.
"""
import argparse
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from gguf import quants
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "gguf"

# For SmolLM2 the input is its chat prompt, "What is the capital of France?" through its
# template (its own tokenizer's ids: "chat-rendered" in tests/data/gguf/smollm2_135m.json).
TINY_INPUT_IDS = [1, 17, 203, 5, 88, 299, 0, 42, 42, 130, 7, 2]

NAMES = {  # llama.cpp name -> Hugging Face name ("{i}": layer)
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def hf_name(name):
    parts = name.split(".")
    if parts[0] == "blk":
        pattern = ".".join(["blk", "{i}"] + parts[2:])
        return NAMES[pattern].replace("{i}", parts[1])
    return NAMES[name]


def unpermute(w, n_head):
    """Adjacent-pair rows (llama.cpp) -> rotate-half rows (Hugging Face)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load(path):
    r = gguf.GGUFReader(str(path))
    f = lambda k, d=None: r.fields[k].contents() if k in r.fields else d
    arch = f("general.architecture")
    assert arch == "llama", arch
    heads, kv_heads = f("llama.attention.head_count"), f("llama.attention.head_count_kv")
    state = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        w = quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, kv_heads)
        state[hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(w))
    tied = "lm_head.weight" not in state
    config = LlamaConfig(
        vocab_size=state["model.embed_tokens.weight"].shape[0],
        hidden_size=f("llama.embedding_length"), intermediate_size=f("llama.feed_forward_length"),
        num_hidden_layers=f("llama.block_count"), num_attention_heads=heads,
        num_key_value_heads=kv_heads, max_position_embeddings=f("llama.context_length"),
        rms_norm_eps=f("llama.attention.layer_norm_rms_epsilon"),
        rope_theta=f("llama.rope.freq_base", 10000.0), tie_word_embeddings=tied,
        bos_token_id=f("tokenizer.ggml.bos_token_id"), eos_token_id=f("tokenizer.ggml.eos_token_id"),
        hidden_act="silu", attn_implementation="eager")
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= ({"lm_head.weight"} if tied else set()), missing
    if tied:
        model.tie_weights()
        assert torch.equal(model.lm_head.weight, state["model.embed_tokens.weight"])
    return model


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy().astype(np.float32)


def write(path, tensors, ints):
    w = gguf.GGUFWriter(str(path), arch="qforge-reference-logits")
    w.add_string("qforge.generator", f"scripts/make_gguf_logits_fixtures.py (torch {torch.__version__}, "
                                      f"transformers {transformers.__version__}, numpy {np.__version__})")
    for k, v in ints.items():
        w.add_array(k, [int(x) for x in v])
    for name, t in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", type=Path)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = load(OUT / "tiny_llama.gguf")
    write(OUT / "tiny_llama_logits.gguf", {"logits": logits_of(model, TINY_INPUT_IDS)},
          {"qforge.input_ids": TINY_INPUT_IDS})
    if args.smollm2:
        import json
        ids = json.loads((OUT / "smollm2_135m.json").read_text())["ids"]["chat-rendered"]
        model = load(args.smollm2)
        logits = logits_of(model, ids)
        argmax = logits.argmax(axis=1)
        rng = np.random.default_rng(5)
        sample = set(rng.choice(logits.shape[1], 200, replace=False).tolist())
        sample |= set(range(17)) | set(argmax.tolist())
        sample = sorted(sample)
        positions = sorted(set(range(0, len(ids), 5)) | {len(ids) - 1})
        write(OUT / "smollm2_135m_logits.gguf", {"logits": logits[positions][:, sample]},
              {"qforge.input_ids": ids, "qforge.positions": positions,
               "qforge.sample_ids": sample, "qforge.argmax": argmax[positions]})
        print("argmax per position:", argmax.tolist())
    print("wrote", OUT)


if __name__ == "__main__":
    main()
