#!/usr/bin/env python3
"""Writes the config.json fixtures under tests/data/configs/ and expected.json, the values that
Hugging Face transformers derives from each of them. transformers is the independent reference
for qforge's config reader (formats/model_config.cpp): defaults, head_dim, KV heads, RoPE.

Usage (transformers needs no torch for its config classes):
    python3 -m venv /work/venv-tf && /work/venv-tf/bin/pip install transformers
    /work/venv-tf/bin/python scripts/make_config_fixtures.py [tests/data/configs]

For each real model, two files: `<name>.hub.json` is the config.json as published on the Hugging
Face Hub (older transformers spell RoPE as `rope_theta` + `rope_scaling` and the dtype as
`torch_dtype`), and `<name>.json` is the same config re-saved by the installed transformers
(`rope_parameters`, `dtype`). Both must parse to the same values. The `*_defaults` files leave
keys out, so the reader's defaults are checked against the classes' own.
"""
import json
import sys
from pathlib import Path

import transformers
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

CLASSES = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config,
           "qwen3": Qwen3Config}

# config.json files as published on the Hub (keys that only training code reads are dropped).
HUB_CONFIGS = {
    # TinyLlama/TinyLlama-1.1B-Chat-v1.0: Llama 2 layout with GQA, untied.
    "tinyllama_1.1b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 5632, "max_position_embeddings": 2048, "num_attention_heads": 32,
        "num_hidden_layers": 22, "num_key_value_heads": 4, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
    },
    # meta-llama/Llama-3.2-1B-Instruct: llama3 RoPE scaling, tied, three EOS ids.
    "llama3.2_1b_instruct": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": False, "num_attention_heads": 32,
        "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "vocab_size": 128256,
    },
    # mistralai/Mistral-7B-v0.1: sliding window declared.
    "mistral_7b_v0.1": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": 32000,
    },
    # Qwen/Qwen2-0.5B: q/k/v biases, tied; sliding_window is set but use_sliding_window is off.
    "qwen2_0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
        "intermediate_size": 4864, "max_position_embeddings": 131072, "max_window_layers": 24,
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False,
        "vocab_size": 151936,
    },
    # HuggingFaceTB/SmolLM2-135M: 9 heads, 3 KV heads; rope_theta is a JSON integer.
    "smollm2_135m": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
        "intermediate_size": 1536, "max_position_embeddings": 8192, "mlp_bias": False,
        "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 100000,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 49152,
    },
    # Shaped like Qwen/Qwen3-0.6B's config.json (QK-norm, head_dim 128 with hidden 1024 and 16
    # heads, tied, no biases; written from its published values, not downloaded here).
    "qwen3_0.6b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
    },
}

# Hand-written configs that leave keys out: every missing value comes from a class default.
SMALL = {"vocab_size": 256, "hidden_size": 1024, "intermediate_size": 2048,
         "num_hidden_layers": 2}
DEFAULT_CONFIGS = {
    "llama_defaults": {"model_type": "llama", **SMALL, "num_attention_heads": 16},
    # MistralConfig's num_key_value_heads defaults to 8 (not to the head count) when absent.
    "mistral_defaults": {"model_type": "mistral", **SMALL, "num_attention_heads": 16},
    # An explicit null sliding window turns it off.
    "mistral_no_window": {"model_type": "mistral", **SMALL, "num_attention_heads": 16,
                          "num_key_value_heads": 4, "sliding_window": None},
    # Qwen2Config's num_key_value_heads defaults to 32; no BOS/EOS defaults.
    "qwen2_defaults": {"model_type": "qwen2", **SMALL, "num_attention_heads": 32},
    # Qwen2 with its sliding window on: only layers from max_window_layers on are windowed.
    "qwen2_window_layers": {"model_type": "qwen2", **SMALL, "num_attention_heads": 32,
                            "use_sliding_window": True, "sliding_window": 64,
                            "max_window_layers": 1},
    # Qwen3Config: head_dim defaults to 128 (not hidden / heads), num_key_value_heads to 32; the
    # window defaults to 4096 and max_window_layers to 28 (more than the 2 layers: none windowed).
    "qwen3_defaults": {"model_type": "qwen3", **SMALL, "num_attention_heads": 32,
                       "use_sliding_window": True},
    # The older "type" key for the RoPE type; original_max_position_embeddings defaults to
    # max_position_embeddings.
    "llama_rope_type_key": {"model_type": "llama", **SMALL, "num_attention_heads": 16,
                            "max_position_embeddings": 4096,
                            "rope_scaling": {"type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
}


def expected_values(raw: dict) -> dict:
    """What transformers makes of a config.json: the values its modeling code uses."""
    model_type = raw["model_type"]
    cfg = CLASSES[model_type].from_dict(dict(raw))
    rope = dict(cfg.rope_parameters)
    rope_type = rope.get("rope_type", "default")
    scaling = {"type": "none", "factor": 1.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
               "original_max_position_embeddings": 0}
    if rope_type == "llama3":
        scaling = {"type": "llama3", "factor": rope["factor"],
                   "low_freq_factor": rope["low_freq_factor"],
                   "high_freq_factor": rope["high_freq_factor"],
                   "original_max_position_embeddings": rope["original_max_position_embeddings"]}
    eos = cfg.eos_token_id
    eos = [] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [eos])
    # Qwen2Attention builds q/k/v with bias=True unconditionally, Mistral's with bias=False; only
    # Llama reads config.attention_bias. (The modeling code needs torch, so this is stated here.)
    attention_bias = {"llama": bool(getattr(cfg, "attention_bias", False)), "mistral": False,
                      "qwen2": True,
                      "qwen3": bool(getattr(cfg, "attention_bias", False))}[model_type]
    window = getattr(cfg, "sliding_window", None) if model_type != "llama" else None
    # The first windowed layer (Qwen2/3's layer_types: full, then sliding); Mistral windows all.
    types = getattr(cfg, "layer_types", None)
    first_sliding = 0
    if window is not None and types is not None:
        first_sliding = next((i for i, t in enumerate(types) if t == "sliding_attention"),
                             len(types))
    dtype = raw.get("torch_dtype", raw.get("dtype"))
    return {
        "arch": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_layers": cfg.num_hidden_layers,
        "num_heads": cfg.num_attention_heads,
        "num_kv_heads": cfg.num_key_value_heads,
        # Qwen2Attention: getattr(config, "head_dim", hidden_size // num_attention_heads)
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": float(rope["rope_theta"]),
        "rope_scaling": scaling,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "attention_bias": attention_bias,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_ids": eos,
        # Llama has no sliding window; Qwen2Config already drops it unless use_sliding_window.
        "sliding_window": window,
        "max_window_layers": first_sliding,
        "torch_dtype": str(dtype) if dtype is not None else "",
    }


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def main() -> None:
    # Defaulted llama3 configs trip a harmless "original == max positions" warning.
    transformers.logging.set_verbosity_error()
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/configs")
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, raw in HUB_CONFIGS.items():
        write_json(out / f"{name}.hub.json", raw)
        resaved = CLASSES[raw["model_type"]].from_dict(dict(raw))
        resaved.to_json_file(str(out / f"{name}.json"))
        expect = expected_values(raw)
        # The re-saved file must mean the same thing to transformers as the Hub original.
        assert expected_values(json.loads((out / f"{name}.json").read_text())) == expect, name
        cases += [{"file": f"{name}.hub.json", "expect": expect},
                  {"file": f"{name}.json", "expect": expect}]
    for name, raw in DEFAULT_CONFIGS.items():
        write_json(out / f"{name}.json", raw)
        cases.append({"file": f"{name}.json", "expect": expected_values(raw)})
    write_json(out / "expected.json",
               {"generator": "scripts/make_config_fixtures.py",
                "transformers_version": transformers.__version__, "cases": cases})


if __name__ == "__main__":
    main()
