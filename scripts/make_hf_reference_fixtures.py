#!/usr/bin/env python3
"""Writes tiny random Hugging Face checkpoints with reference logits computed by transformers,
the independent reference for qforge's runtime (tests compare the runtime's logits with these).

Run by hand, not in CI (torch is several GB). With a virtual environment outside the repo:

    python3 -m venv /work/venv-torch
    /work/venv-torch/bin/pip install torch transformers safetensors numpy
    /work/venv-torch/bin/python scripts/make_hf_reference_fixtures.py [tests/data/hf_models]

Writes, for each model below, tests/data/hf_models/<name>/:
  config.json        as transformers' save_pretrained writes it
  model.safetensors  float32 weights (save_pretrained, safetensors serialization)
  reference.json     {"model_class", "input_ids": [...], "logits": [[vocab floats] per position],
                      "logits_f64": [...], "sensitivity": {...}, "source": {versions, seed}}
"logits" is one full forward pass over input_ids in float32, eval mode, eager attention;
"logits_f64" is the same weights run in float64 (the exact math the float32 run approximates).
"sensitivity" holds the relative L2 change of the float64 logits when the feature a model is
there to test is turned off (RoPE theta, llama3 scaling, the q/k/v biases, GQA sharing), so a
runtime that ignored the feature would fail a 1e-4 comparison by orders of magnitude; the script
refuses to write a model whose features do not move the logits by at least 1e-2.

Determinism: weights come from torch.Generator seeded per model, the same versions give the
same bytes. Sizes: hidden 32 (vocab 256 at hidden 64 alone would be 130 KB per embedding),
so every model.safetensors stays well under 200 KB.
"""
import json
import math
import platform
import shutil
import sys
from pathlib import Path

import numpy
import safetensors
import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

# A fixed sequence: BOS first, the edge ids 0 and vocab-1, a repeated token.
INPUT_IDS = [1, 17, 203, 5, 88, 255, 0, 42, 42, 130, 7, 99]
MIN_SENSITIVITY = 1e-2

# Shared tiny shape: 4 query heads of 8, 2 KV heads (GQA), intermediate 86 (not a multiple of
# 32), 2 layers, vocab 256.
COMMON = dict(vocab_size=256, hidden_size=32, intermediate_size=86, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, hidden_act="silu")

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 32}

# name -> (model class, config class, config kwargs, seed, what to switch off for sensitivity).
MODELS = {
    # GQA, untied lm_head, non-default rope_theta.
    "llama_gqa_untied": (LlamaForCausalLM, LlamaConfig,
                         dict(COMMON, tie_word_embeddings=False, rope_theta=500.0), 1,
                         {"rope_theta": dict(rope_theta=10000.0)}),
    # Llama 3.1-style RoPE scaling, tied embeddings. With head_dim 8 and theta 100 the four RoPE
    # wavelengths 2*pi*100^(i/4) are 6.3, 20, 63 and 199; original_max_position_embeddings 32 with
    # factors 1 and 4 puts the band edges at 8 and 32, so one frequency is kept (< 8), one is
    # interpolated (8..32) and two are divided by the factor (> 32).
    "llama3_rope_tied": (LlamaForCausalLM, LlamaConfig,
                         dict(COMMON, tie_word_embeddings=True, rope_theta=100.0,
                              rope_scaling=LLAMA3_SCALING), 2,
                         {"rope_scaling": dict(rope_scaling=None)}),
    # Mistral: untied; the sliding window (64) is longer than the sequence, so it changes nothing.
    "mistral": (MistralForCausalLM, MistralConfig,
                dict(COMMON, tie_word_embeddings=False, rope_theta=10000.0, sliding_window=64), 3,
                {"gqa_sharing": dict(num_key_value_heads=4)}),
    # Qwen2: q/k/v biases, tied embeddings, rope_theta 1e6.
    "qwen2_bias_tied": (Qwen2ForCausalLM, Qwen2Config,
                        dict(COMMON, tie_word_embeddings=True, rope_theta=1e6,
                             use_sliding_window=False), 4,
                        {"qkv_bias": "zero_biases"}),
}


def init_weights(model, seed):
    """Scaled normal weights, so attention is peaked (RoPE and masking matter) and logits have
    unit scale; norm weights near 1 but not 1, biases non-zero. transformers' own init (std
    0.02) gives near-uniform attention, which would hide RoPE mistakes."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                gain = 2.0 if ("q_proj" in name or "k_proj" in name) else 1.0
                p.copy_(gain * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def build(model_cls, config_cls, kwargs, seed):
    config = config_cls(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    init_weights(model, seed)
    return model


def logits_of(model, dtype):
    m = model.to(dtype)
    with torch.no_grad():
        out = m(torch.tensor([INPUT_IDS]), use_cache=False).logits[0]
    model.to(torch.float32)
    return out


def rel_l2(a, b):
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def sensitivity(model_cls, config_cls, kwargs, seed, model, variant, ref64):
    if variant == "zero_biases":
        other = build(model_cls, config_cls, kwargs, seed)
        with torch.no_grad():
            for name, p in other.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
    elif "num_key_value_heads" in variant:
        # The mistake a runtime can make with GQA: query head h reading KV head h % n_kv instead
        # of h / group. That model is this one with the KV heads repeated in interleaved order.
        other = build(model_cls, config_cls, dict(kwargs, **variant), seed)
        shared = {k: v for k, v in model.state_dict().items()
                  if "k_proj" not in k and "v_proj" not in k}
        other.load_state_dict(shared, strict=False)
        group = kwargs["num_attention_heads"] // kwargs["num_key_value_heads"]
        hd = kwargs["hidden_size"] // kwargs["num_attention_heads"]
        with torch.no_grad():
            for li, layer in enumerate(model.model.layers):
                for proj in ("k_proj", "v_proj"):
                    w = getattr(layer.self_attn, proj).weight  # [kv_heads*hd, hidden]
                    heads = w.view(-1, hd, w.shape[1])
                    wrong = heads.repeat(group, 1, 1).reshape(-1, w.shape[1])
                    getattr(other.model.layers[li].self_attn, proj).weight.copy_(wrong)
    else:
        other = build(model_cls, config_cls, dict(kwargs, **variant), seed)
        other.load_state_dict(model.state_dict())
    return rel_l2(logits_of(other, torch.float64), ref64)


def f32_list(t):
    return [[float(f"{x:.9g}") for x in row] for row in t.tolist()]


def main():
    out_root = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/hf_models")
    torch.use_deterministic_algorithms(True)
    for name, (model_cls, config_cls, kwargs, seed, variants) in MODELS.items():
        model = build(model_cls, config_cls, kwargs, seed)
        ref32 = logits_of(model, torch.float32)
        ref64 = logits_of(model, torch.float64)
        sens = {k: sensitivity(model_cls, config_cls, kwargs, seed, model, v, ref64)
                for k, v in variants.items()}
        for k, v in sens.items():
            if v < MIN_SENSITIVITY:
                raise SystemExit(f"{name}: switching off {k} moves the logits by only {v:.3g}")
        f32_vs_f64 = rel_l2(ref32.double(), ref64)

        out = out_root / name
        if out.exists():
            shutil.rmtree(out)
        tmp = out_root / (name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        model.save_pretrained(tmp)
        (tmp / "generation_config.json").unlink(missing_ok=True)
        reference = {
            "model_class": model_cls.__name__,
            "input_ids": INPUT_IDS,
            "logits": f32_list(ref32),
            "logits_f64": ref64.tolist(),
            "f32_vs_f64_rel_l2": f32_vs_f64,
            "sensitivity": sens,
            "source": {
                "script": "scripts/make_hf_reference_fixtures.py",
                "seed": seed,
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "safetensors": safetensors.__version__,
                "numpy": numpy.__version__,
                "mode": "eval, eager attention, use_cache=False, one forward over input_ids",
            },
        }
        (tmp / "reference.json").write_text(json.dumps(reference) + "\n")
        tmp.rename(out)
        sizes = ", ".join(f"{p.name} {p.stat().st_size} B" for p in sorted(out.iterdir()))
        print(f"{name}: {sizes}; f32 vs f64 {f32_vs_f64:.2e}; sensitivity " +
              ", ".join(f"{k} {v:.3g}" for k, v in sens.items()))


if __name__ == "__main__":
    main()
