#!/usr/bin/env python3
"""Writes tiny random Hugging Face checkpoints with reference logits computed by transformers,
the independent reference for qforge's runtime (tests compare the runtime's logits with these).

Run by hand, not in CI (torch is several GB). With a virtual environment outside the repo:

    python3 -m venv /work/venv-torch
    /work/venv-torch/bin/pip install torch transformers safetensors numpy
    /work/venv-torch/bin/python scripts/make_hf_reference_fixtures.py [tests/data/hf_models [NAME...]]

(NAMEs: only those models are rewritten.)

Writes, for each model below, tests/data/hf_models/<name>/:
  config.json        as transformers' save_pretrained writes it
  model.safetensors  float32 weights (save_pretrained, safetensors serialization)
  reference.json     {"model_class", "input_ids": [...], "logits": [[vocab floats] per position],
                      "logits_f64": [...], "decode_vs_prefill_rel_l2", "sensitivity": {...},
                      "source": {versions, seed}}
  tokenizer.json     (WITH_BYTE_TOKENIZER models) a 256-symbol byte-level BPE, PyPI tokenizers
and for GGUF_MODELS tests/data/gguf/<file>: the same weights as llama.cpp's converter names them
(PyPI gguf's GGUFWriter, F32).
"logits" is one full forward pass over input_ids in float32, eval mode, eager attention;
"logits_f64" is the same weights run in float64 (the exact math the float32 run approximates).
"sensitivity" holds the relative L2 change of the float64 logits when the feature a model is
there to test is turned off (RoPE theta, llama3 scaling, the q/k/v biases, GQA sharing), so a
runtime that ignored the feature would fail a 1e-4 comparison by orders of magnitude; the script
refuses to write a model whose features do not move the logits by at least 1e-2.

The script refuses to write a model whose transformers decode (its KV cache, token by token)
differs from its one forward pass: windowed models test the cache's window against the mask's.

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
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

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

# Gemma's tiny shape: COMMON's, with Gemma's activation (hidden_act is not what Gemma reads).
GEMMA = {k: v for k, v in COMMON.items() if k != "hidden_act"}
GEMMA.update(hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=0)
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}

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
    # Mistral with a sliding window of 4 over 12 positions: positions 4 .. 11 see only the last
    # 4 keys (transformers keeps keys above pos - window).
    "mistral_window4": (MistralForCausalLM, MistralConfig,
                        dict(COMMON, tie_word_embeddings=False, rope_theta=10000.0,
                             sliding_window=4), 5,
                        {"sliding_window": dict(sliding_window=None)}),
    # Qwen3: per-head q_norm / k_norm, no biases, head_dim 16 (not hidden / heads = 8), untied;
    # a sliding window of 5 from layer 1 on (max_window_layers 1: layer 0 attends fully).
    "qwen3_qknorm_window": (Qwen3ForCausalLM, Qwen3Config,
                            dict(COMMON, tie_word_embeddings=False, rope_theta=1e6, head_dim=16,
                                 attention_bias=False, use_sliding_window=True, sliding_window=5,
                                 max_window_layers=1), 6,
                            {"qk_norm": "identity_qk_norm",
                             "sliding_window": dict(use_sliding_window=False)}),
    # Gemma 2: sqrt(hidden) embedding scale, (1 + w) norms, sandwich norms, GeGLU, tied; the
    # window of 4 on layer 0 (layer_types: every other layer sliding); soft-capping 2 and 3 and
    # query_pre_attn_scalar 24 (not head_dim 8), small enough to move the logits.
    "gemma2_softcap_window": (Gemma2ForCausalLM, Gemma2Config,
                              dict(GEMMA, head_dim=8, query_pre_attn_scalar=24, sliding_window=4,
                                   attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                   rope_parameters={"rope_type": "default",
                                                    "rope_theta": 10000.0}), 7,
                              {"attn_softcap": dict(attn_logit_softcapping=None),
                               "final_softcap": dict(final_logit_softcapping=None),
                               "query_scale": dict(query_pre_attn_scalar=8),
                               "sliding_window": dict(layer_types=["full_attention"] * 2)}),
    # Gemma 3 text: QK-norm, 6 layers in its 5 sliding : 1 full pattern (window 4), the sliding
    # layers' RoPE base 10000 and the full layer's 1e6 with linear scaling (factor 8, as the 4B+
    # configs); query_pre_attn_scalar = head_dim 16 (as the 270M model; a GGUF cannot say
    # otherwise), GQA 2 : 1, intermediate 40.
    "gemma3_qknorm_local_rope": (Gemma3ForCausalLM, Gemma3TextConfig,
                                 dict(GEMMA, num_hidden_layers=6, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=16, intermediate_size=40,
                                      query_pre_attn_scalar=16, sliding_window=4,
                                      rope_parameters=GEMMA3_ROPE), 8,
                                 {"qk_norm": "identity_qk_norm",
                                  "local_rope": dict(rope_parameters=dict(
                                      GEMMA3_ROPE, sliding_attention={"rope_type": "default",
                                                                      "rope_theta": 1e6})),
                                  "rope_scaling": dict(rope_parameters=dict(
                                      GEMMA3_ROPE, full_attention={"rope_type": "default",
                                                                   "rope_theta": 1e6})),
                                  "sliding_window": dict(layer_types=["full_attention"] * 6)}),
    # Phi-3: q/k/v in one qkv_proj and gate/up in one gate_up_proj (qforge splits them by rows at
    # conversion), untied, a sliding window of 6 on every layer; no pad id (Phi3Config's 32000 is
    # past this vocabulary).
    "phi3_fused_window": (Phi3ForCausalLM, Phi3Config,
                          dict(COMMON, tie_word_embeddings=False, rope_theta=10000.0,
                               sliding_window=6, pad_token_id=None), 7,
                          {"sliding_window": dict(sliding_window=None),
                           "gate_up_order": "swap_gate_up"}),
}

# Models that get a tokenizer.json (so the CLI can calibrate, score and generate on them): a
# byte-level BPE of the 256 byte symbols and no merges, id = byte value, written by PyPI
# tokenizers.
WITH_BYTE_TOKENIZER = {"qwen3_qknorm_window", "gemma2_softcap_window", "gemma3_qknorm_local_rope",
                       "phi3_fused_window"}

# Tiny GGUF files of the same weights, as llama.cpp's convert_hf_to_gguf.py names and describes
# them (gguf-py's constants), for models whose GGUF architecture keeps every feature: name ->
# (GGUF architecture, file under tests/data/gguf).
GGUF_MODELS = {"qwen3_qknorm_window": ("qwen3", "tiny_qwen3.gguf"),
               "gemma2_softcap_window": ("gemma2", "tiny_gemma2.gguf"),
               "gemma3_qknorm_local_rope": ("gemma3", "tiny_gemma3.gguf"),
               "phi3_fused_window": ("phi3", "tiny_phi3.gguf")}


def init_weights(model, seed):
    """Scaled normal weights, so attention is peaked (RoPE and masking matter) and logits have
    unit scale; norm weights near 1 but not 1, biases non-zero. transformers' own init (std
    0.02) gives near-uniform attention, which would hide RoPE mistakes."""
    g = torch.Generator().manual_seed(seed)
    # Gemma applies its norm weights w as (1 + w): near 0, so the multiplier is near 1 too.
    norm_base = 0.0 if model.config.model_type.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(norm_base + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                gain = 2.0 if ("q_proj" in name or "k_proj" in name or "qkv_proj" in name) else 1.0
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
    if variant == "identity_qk_norm":
        # A runtime that skipped QK-norm: the same weights without the per-head norms.
        other = build(model_cls, config_cls, kwargs, seed)
        other.load_state_dict(model.state_dict())
        for layer in other.model.layers:
            layer.self_attn.q_norm = torch.nn.Identity()
            layer.self_attn.k_norm = torch.nn.Identity()
    elif variant == "swap_gate_up":
        # A runtime that split gate_up_proj the wrong way round (up first).
        other = build(model_cls, config_cls, kwargs, seed)
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            for layer in other.model.layers:
                w = layer.mlp.gate_up_proj.weight
                w.copy_(torch.cat(w.chunk(2, dim=0)[::-1]))
    elif variant == "zero_biases":
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
        hd = kwargs.get("head_dim", kwargs["hidden_size"] // kwargs["num_attention_heads"])
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


def decode_logits(model):
    """transformers' own token-by-token decode with its KV cache: the path whose sliding-window
    cache must agree with the one full forward."""
    rows, past = [], None
    with torch.no_grad():
        for t, tok in enumerate(INPUT_IDS):
            out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True,
                        cache_position=torch.tensor([t]))
            past = out.past_key_values
            rows.append(out.logits[0, -1])
    return torch.stack(rows)


GEMMA_GGUF_NAMES = {"input_layernorm.weight": "attn_norm.weight",
                    "post_attention_layernorm.weight": "post_attention_norm.weight",
                    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                    "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}


def write_gguf(model, arch, path):
    """The model as llama.cpp's converter writes it: its tensor names, F32, rotate-half q/k
    (qwen2/qwen3/gemma use NEOX RoPE, no permutation), and the metadata keys of LLM_ARCH_QWEN3,
    LLM_ARCH_GEMMA2 or LLM_ARCH_GEMMA3 (convert_hf_to_gguf.py's Gemma2Model / Gemma3Model: norm
    weights + 1, no output.weight, sliding_window, soft-capping, rope scaling type linear), or
    LLM_ARCH_PHI3 (Phi3MiniModel: qkv_proj and gate_up_proj kept fused as attn_qkv and ffn_up,
    no key_length, rope.dimension_count hidden / heads, rope.scaling.original_context_length,
    sliding_window or 0)."""
    import gguf
    c = model.config
    gemma = arch.startswith("gemma")
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight",
                 "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight",
                 "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.o_proj.weight": "attn_output.weight",
                 "self_attn.q_norm.weight": "attn_q_norm.weight",
                 "self_attn.k_norm.weight": "attn_k_norm.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight",
                 "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                 "mlp.down_proj.weight": "ffn_down.weight",
                 "self_attn.qkv_proj.weight": "attn_qkv.weight",
                 "mlp.gate_up_proj.weight": "ffn_up.weight"}
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_name("qforge tiny " + arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
        w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
        w.add_sliding_window(c.sliding_window or 0)
    else:
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    rope = c.rope_parameters
    if arch == "gemma3":
        rope = rope["full_attention"]  # the global layers' (the local base is llama.cpp's 10000)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if gemma:
        per_layer.update(GEMMA_GGUF_NAMES)
        w.add_sliding_window(c.sliding_window)
        if arch == "gemma2":
            w.add_attn_logit_softcapping(c.attn_logit_softcapping)
            w.add_final_logit_softcapping(c.final_logit_softcapping)
        if rope.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope["factor"])
    for name, t in model.state_dict().items():
        if gemma and name == "lm_head.weight":
            continue  # tied: llama.cpp's Gemma has no output.weight
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            out = f"blk.{i}.{per_layer[rest]}"
        else:
            out = names[name]
        data = t.detach().to(torch.float32)
        if gemma and name.endswith("norm.weight"):
            data = data + 1  # Gemma2Model/Gemma3Model.modify_tensors (norm_shift)
        w.add_tensor(out, data.numpy().copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_byte_tokenizer(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    # ByteLevel.alphabet() is a set; bytes_to_unicode's order is byte order: rebuild it.
    chars = {}
    n = 0
    for b in range(256):
        printable = (33 <= b <= 126) or (161 <= b <= 172) or (174 <= b <= 255)
        if printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    assert set(chars.values()) == set(ByteLevel.alphabet())
    vocab = {chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))
    assert tok.encode("Hi ").ids == [72, 105, 32]


def f32_list(t):
    return [[float(f"{x:.9g}") for x in row] for row in t.tolist()]


def main():
    out_root = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/hf_models")
    only = set(sys.argv[2:])  # model names to (re)write; none: all
    torch.use_deterministic_algorithms(True)
    for name, (model_cls, config_cls, kwargs, seed, variants) in MODELS.items():
        if only and name not in only:
            continue
        model = build(model_cls, config_cls, kwargs, seed)
        ref32 = logits_of(model, torch.float32)
        ref64 = logits_of(model, torch.float64)
        sens = {k: sensitivity(model_cls, config_cls, kwargs, seed, model, v, ref64)
                for k, v in variants.items()}
        for k, v in sens.items():
            if v < MIN_SENSITIVITY:
                raise SystemExit(f"{name}: switching off {k} moves the logits by only {v:.3g}")
        f32_vs_f64 = rel_l2(ref32.double(), ref64)
        dec32 = decode_logits(model)
        decode_vs_prefill = rel_l2(dec32.double(), ref32.double())
        if decode_vs_prefill > 1e-5:
            raise SystemExit(f"{name}: transformers' cached decode differs from its prefill by "
                             f"{decode_vs_prefill:.3g}")

        out = out_root / name
        if out.exists():
            shutil.rmtree(out)
        tmp = out_root / (name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        model.save_pretrained(tmp)
        (tmp / "generation_config.json").unlink(missing_ok=True)
        if name in WITH_BYTE_TOKENIZER:
            write_byte_tokenizer(tmp)
        reference = {
            "model_class": model_cls.__name__,
            "input_ids": INPUT_IDS,
            "logits": f32_list(ref32),
            "logits_f64": ref64.tolist(),
            "f32_vs_f64_rel_l2": f32_vs_f64,
            "decode_vs_prefill_rel_l2": decode_vs_prefill,
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
        if name in GGUF_MODELS:
            arch, file = GGUF_MODELS[name]
            write_gguf(model, arch, out_root.parent / "gguf" / file)
        sizes = ", ".join(f"{p.name} {p.stat().st_size} B" for p in sorted(out.iterdir()))
        print(f"{name}: {sizes}; f32 vs f64 {f32_vs_f64:.2e}; sensitivity " +
              ", ".join(f"{k} {v:.3g}" for k, v in sens.items()))


if __name__ == "__main__":
    main()
