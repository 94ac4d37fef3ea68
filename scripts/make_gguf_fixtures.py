#!/usr/bin/env python3
"""Writes the GGUF fixtures in tests/data/gguf/ with llama.cpp's own Python package `gguf` (its
GGUFWriter and numpy quantizers/dequantizers), `tokenizers` (Hugging Face's Rust tokenizer) and
`jinja2` (what transformers renders chat templates with) as the independent references.

    python3 -m venv /work/venv-gguf
    /work/venv-gguf/bin/pip install gguf numpy tokenizers jinja2
    /work/venv-gguf/bin/python scripts/make_gguf_fixtures.py [--smollm2 models/SmolLM2-135M-Instruct.Q4_1.gguf]

Writes (each small; tests/data/gguf/README.md describes them):
  dequant.gguf            per ggml type T that qforge dequantizes: tensor "T.blocks" (raw
                          blocks: random bytes with finite fp16 scales, plus, for the types the
                          package can quantize, llama.cpp-quantized rows with outliers, zeros and
                          tiny values) and "T.expected" (F32: the package's dequantization)
  tiny_llama.gguf         a 2-layer "llama" model (hidden 64, 4 heads of 16, 2 KV heads,
                          untied output) with seeded random weights, q/k permuted as
                          convert_hf_to_gguf.py does, one 32-block type per tensor, and a
                          byte-level BPE tokenizer trained here (pre "smollm", ChatML template)
  tiny_llama.json         per converted tensor a fingerprint of the Hugging Face-layout values
                          (gguf dequantization, then the inverse permutation written here), and
                          the trained tokenizer's ids for tests/data/tokenizers/texts.json
  chat_templates.json     real chat templates (SmolLM2, ChatML, Llama 2, Llama 3, Zephyr,
                          Mistral, Gemma 3, Qwen3) rendered by jinja2 as transformers configures
                          it, and templates expected to be refused (--templates-only: this file
                          alone)
  smollm2_135m.json       (with --smollm2) ids of SmolLM2-135M's own vocabulary, merges and
                          pre-tokenizer (Digits individual + ByteLevel) for the fixture texts

Deterministic: seeded generators; the package versions are recorded in each JSON file.
"""
import argparse
import json
import math
from pathlib import Path

import gguf
import jinja2
import numpy as np
import tokenizers
from gguf import GGMLQuantizationType as T
from gguf import quants
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "gguf"
TEXTS = ROOT / "tests" / "data" / "tokenizers" / "texts.json"
VERSIONS = f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else '?'}, numpy {np.__version__}, " \
           f"tokenizers {tokenizers.__version__}, jinja2 {jinja2.__version__}"

# English prose written for these fixtures (the shared corpus may not be copied here).
EXTRA_TEXTS = {
    "prose": "The quick brown fox jumps over the lazy dog. It wasn't the first time; the dog, "
             "having seen 3,141 foxes since 2019, didn't even look up.",
    "chat-rendered": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                     "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
                     "<|im_end|>\n<|im_start|>assistant\n",
    "instructions": "Write a haiku about autumn leaves.\n\nThen explain, in one sentence, why "
                    "haiku have 17 syllables.",
}


def fixture_texts():
    texts = {}
    for t in json.loads(TEXTS.read_text())["texts"]:
        if "text" in t:  # shared-corpus excerpts are skipped: ids would be a copy of the text
            texts[t["name"]] = t["text"]
    texts.update(EXTRA_TEXTS)
    return texts


# --------------------------------------------------------------------------------------------
# Dequantization vectors

DEQUANT_TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                 T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
QUANTIZABLE = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}
# fp16 scales planted in random blocks: normal, negative, subnormal, zero, large.
SCALES = np.array([0.0123, -0.0456, 6.1e-5, 3.0e-7, 0.0, 1.5, -0.25, 200.0], dtype=np.float16)


def scale_offsets(qtype):
    """Byte offsets of the fp16 scale fields (d, dmin, m) inside one block of qtype."""
    return {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
            T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
            T.Q6_K: [208]}[qtype]


def random_blocks(rng, qtype, blocks):
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(blocks, block_bytes), dtype=np.uint8)
    for b in range(blocks):
        for k, off in enumerate(scale_offsets(qtype)):
            i = (b + 3 * k) % len(SCALES)
            data[b, off:off + 2] = SCALES[i:i + 1].view(np.uint8)
    return data


def quantized_rows(rng, qtype):
    rows = [rng.standard_normal(64) * 0.05,
            np.where(np.arange(64) == 5, 4.0, rng.standard_normal(64) * 0.01),  # an outlier
            np.zeros(64),
            -np.abs(rng.standard_normal(64)) * 0.3,
            rng.standard_normal(64) * 1e-6]
    data = np.stack(rows).astype(np.float32)
    return quants.quantize(data, qtype).reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])


def float_values(rng):
    special = [0.0, -0.0, 1.0, -2.5, 65504.0, -65504.0, 6.0e-8, 1.0e-5, 3.14159265, 1e30, -1e-30,
               float("inf"), float("-inf")]
    return np.concatenate([np.array(special), rng.standard_normal(51) * 10]).astype(np.float32)


def write_dequant(path):
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), arch="qforge-dequant-vectors")
    for qtype in DEQUANT_TYPES:
        name = qtype.name
        if qtype in (T.F32, T.F16, T.BF16):
            values = float_values(rng)
            if qtype == T.F32:
                raw = values.view(np.uint8)
            elif qtype == T.F16:
                with np.errstate(over="ignore"):  # 1e30 becomes inf, as it should
                    raw = values.astype(np.float16).view(np.uint8)
            else:
                raw = quants.quantize(values, T.BF16).view(np.uint8)
            raw = raw.reshape(1, -1)
        else:
            blocks = 6 if qtype in QUANTIZABLE else 2
            raw = random_blocks(rng, qtype, blocks)
            if qtype in QUANTIZABLE:
                raw = np.concatenate([raw, quantized_rows(rng, qtype)])
            raw = raw.reshape(1, -1)
        expected = quants.dequantize(raw, qtype).astype(np.float32).reshape(1, -1)
        w.add_tensor(f"{name}.blocks", raw, raw_dtype=qtype)
        w.add_tensor(f"{name}.expected", expected, raw_dtype=T.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --------------------------------------------------------------------------------------------
# Tiny llama model

TINY = dict(vocab=300, hidden=64, heads=4, kv_heads=2, intermediate=64, layers=2, context=256,
            eps=1e-5, theta=10000.0)
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ggml type per tensor kind and layer: every 32-block type, F16 and BF16 appear.
TINY_TYPES = {
    "attn_q": [T.Q4_0, T.Q8_0], "attn_k": [T.Q4_1, T.Q5_0], "attn_v": [T.F16, T.BF16],
    "attn_output": [T.Q5_1, T.Q4_0], "ffn_gate": [T.Q8_0, T.Q4_1], "ffn_up": [T.Q5_0, T.Q5_1],
    "ffn_down": [T.Q4_1, T.Q8_0],
}


def train_tiny_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY["vocab"], special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    corpus = list(EXTRA_TEXTS.values()) + [
        "the the the and and of of to to in in is is that that it it was was",
        "Once upon a time there was a little girl who loved the forest and the river.",
    ] * 20
    tok.train_from_iterator(corpus, trainer)
    return tok


def hf_permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py LlamaModel.permute: rotate-half rows -> adjacent-pair rows."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def hf_unpermute(w, n_head):
    """The inverse of hf_permute (written independently of the C++ side)."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def fingerprint(values):
    """sum of v[r, c] * (((7 r + 3 c) mod 11) - 5) in float64: a row reordering changes it."""
    v = values.reshape(values.shape[0], -1).astype(np.float64) if values.ndim > 1 \
        else values.reshape(1, -1).astype(np.float64)
    r = np.arange(v.shape[0])[:, None]
    c = np.arange(v.shape[1])[None, :]
    return float(np.sum(v * (((7 * r + 3 * c) % 11) - 5)))


def write_tiny(gguf_path, json_path):
    tok = train_tiny_tokenizer()
    vocab = tok.get_vocab()
    tokens = [None] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    assert len(tokens) == TINY["vocab"], len(tokens)
    model = json.loads(tok.to_str())["model"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]

    rng = np.random.default_rng(11)
    h, hd = TINY["hidden"], TINY["hidden"] // TINY["heads"]
    kv, inter, v = TINY["kv_heads"] * hd, TINY["intermediate"], TINY["vocab"]
    w = gguf.GGUFWriter(str(gguf_path), arch="llama")
    w.add_name("qforge tiny llama fixture")
    w.add_context_length(TINY["context"])
    w.add_embedding_length(h)
    w.add_block_count(TINY["layers"])
    w.add_feed_forward_length(inter)
    w.add_head_count(TINY["heads"])
    w.add_head_count_kv(TINY["kv_heads"])
    w.add_rope_freq_base(TINY["theta"])
    w.add_layer_norm_rms_eps(TINY["eps"])
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    prints = {}

    def add(name, hf_values, qtype, unpermute_heads=None):
        gguf_values = hf_values
        if unpermute_heads is not None:
            gguf_values = hf_permute(hf_values, TINY["heads"], unpermute_heads)
        gguf_values = gguf_values.astype(np.float32)
        if qtype == T.F32:
            raw = gguf_values
            w.add_tensor(name, raw, raw_dtype=T.F32)
        elif qtype == T.F16:
            raw = gguf_values.astype(np.float16)
            w.add_tensor(name, raw, raw_dtype=T.F16)
        else:
            raw = quants.quantize(gguf_values, qtype)
            w.add_tensor(name, raw, raw_dtype=qtype)
        deq = quants.dequantize(raw.view(np.uint8) if qtype != T.F32 else raw.view(np.uint8), qtype)
        deq = deq.astype(np.float32).reshape(gguf_values.shape)
        if unpermute_heads is not None:
            deq = hf_unpermute(deq, unpermute_heads)
        prints[name] = fingerprint(deq)

    def matrix(rows, cols, scale):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    add("token_embd.weight", matrix(v, h, 0.5), T.Q8_0)
    for i in range(TINY["layers"]):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", norm(h), T.F32)
        add(p + "attn_q.weight", matrix(h, h, 0.15), TINY_TYPES["attn_q"][i], TINY["heads"])
        add(p + "attn_k.weight", matrix(kv, h, 0.15), TINY_TYPES["attn_k"][i], TINY["kv_heads"])
        add(p + "attn_v.weight", matrix(kv, h, 0.15), TINY_TYPES["attn_v"][i])
        add(p + "attn_output.weight", matrix(h, h, 0.15), TINY_TYPES["attn_output"][i])
        add(p + "ffn_norm.weight", norm(h), T.F32)
        add(p + "ffn_gate.weight", matrix(inter, h, 0.15), TINY_TYPES["ffn_gate"][i])
        add(p + "ffn_up.weight", matrix(inter, h, 0.15), TINY_TYPES["ffn_up"][i])
        add(p + "ffn_down.weight", matrix(h, inter, 0.12), TINY_TYPES["ffn_down"][i])
    add("output_norm.weight", norm(h), T.F32)
    add("output.weight", matrix(v, h, 0.2), T.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ids = {name: tok.encode(text, add_special_tokens=True).ids
           for name, text in fixture_texts().items()}
    json_path.write_text(json.dumps({
        "generator": f"scripts/make_gguf_fixtures.py ({VERSIONS})",
        "fingerprint": "sum over [rows, cols] of v * (((7 row + 3 col) mod 11) - 5), float64, "
                       "of the Hugging Face-layout values (1-D tensors: one row)",
        "fingerprints": prints,
        "texts": {name: text for name, text in EXTRA_TEXTS.items()},
        "ids": ids,
    }, ensure_ascii=False, separators=(",", ":")) + "\n")


# --------------------------------------------------------------------------------------------
# Chat templates

TEMPLATES = {
    "smollm2": "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "chatml": CHATML,
    "llama2": "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
    "llama3": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
    "zephyr": "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}",
    "mistral": "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
    # Qwen2.5-style: the tool-call branch (tojson) is not taken without tools, so it renders.
    "qwen2.5-no-tools": "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- for message in messages %}{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "namespace": "{% set ns = namespace(found=false, n=0) %}{% for message in messages %}{% set ns.found = true %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.found }} {{ ns.n }}",
    # Real templates of models whose GGUF may lack one (scripts/chat_templates/README.md).
    "gemma3": (ROOT / "scripts" / "chat_templates" / "gemma3.jinja").read_text(),
    "qwen3": (ROOT / "scripts" / "chat_templates" / "qwen3.jinja").read_text(),
    "whitespace-control": "{%- for message in messages -%}\n  {{- '[' ~ message.role | upper ~ '] ' -}}\n  {{ message.content | trim }}\n  {%- if not loop.last %} | {% endif -%}\n{%- endfor %}\n{# a comment #}\n{%- if add_generation_prompt %}[{{ messages | length }} messages]{% endif %}",
}
# Templates that use Jinja beyond the supported subset (tool calls, macros, namespaces, JSON).
# Templates that reach Jinja beyond the supported subset when rendered.
REFUSED = {
    "tojson": "{% for message in messages %}{{ message | tojson }}{% endfor %}",
    "macro": "{% macro render(m) %}{{ m['content'] }}{% endmacro %}{% for message in messages %}{{ render(message) }}{% endfor %}",
    "keyword-arguments": "{% for message in messages %}{{ message.content | truncate(length=5) }}{% endfor %}",
    "string-format": "{% for message in messages %}{{ '%s: %s' % (message.role, message.content) }}{% endfor %}",
}
CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is the capital of France?"}],
    "system-user": [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "  Hi there!  "}],
    "multi-turn": [{"role": "user", "content": "Hello"},
                   {"role": "assistant", "content": " Hi! How can I help? "},
                   {"role": "user", "content": "Tell me a joke."}],
    "not-alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    # Qwen3 moves an answer's <think> block into reasoning and shows it only after the last query.
    "thinking": [{"role": "system", "content": "Think first."},
                 {"role": "user", "content": "2+2?"},
                 {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n4"},
                 {"role": "user", "content": "And 3+3?"},
                 {"role": "assistant", "content": "<think>\nAlso easy.\n</think>\n\n6"}],
}
# Extra variables some templates read (one case per entry; {} is the plain render).
TEMPLATE_VARIABLES = {"qwen3": [{}, {"enable_thinking": False}, {"enable_thinking": True}]}


def render_templates(path):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    # transformers' _compile_jinja_template: these settings and raise_exception.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    cases = []
    for tname, source in TEMPLATES.items():
        template = env.from_string(source)
        for cname, messages in CONVERSATIONS.items():
            for gen in (True, False):
                for variables in TEMPLATE_VARIABLES.get(tname, [{}]):
                    case = {"template": tname, "conversation": cname, "add_generation_prompt": gen}
                    if variables:
                        case["variables"] = variables
                    try:
                        case["expected"] = template.render(messages=messages, add_generation_prompt=gen,
                                                           bos_token="<s>", eos_token="</s>", **variables)
                    except jinja2.exceptions.TemplateError as e:
                        case["error"] = str(e)
                    cases.append(case)
    path.write_text(json.dumps({
        "generator": f"scripts/make_gguf_fixtures.py ({VERSIONS})",
        "environment": "jinja2 ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True), "
                       "raise_exception; bos_token '<s>', eos_token '</s>'",
        "templates": TEMPLATES, "refused": REFUSED, "conversations": CONVERSATIONS,
        "cases": cases,
    }, ensure_ascii=False, separators=(",", ":")) + "\n")


# --------------------------------------------------------------------------------------------
# SmolLM2-135M's tokenizer

def write_smollm2(gguf_path, json_path):
    r = gguf.GGUFReader(str(gguf_path))
    field = lambda k: r.fields[k].contents()
    tokens, types, merges = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type"), \
        field("tokenizer.ggml.merges")
    assert field("tokenizer.ggml.pre") == "smollm" and field("tokenizer.ggml.model") == "gpt2"
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = []
    for m in merges:
        space = m.index(" ", 1)  # llama.cpp splits at the first space after the first byte
        pairs.append((m[:space], m[space + 1:]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    # SmolLM2's tokenizer.json: Digits(individual) then ByteLevel(add_prefix_space=False).
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == 3])
    ids = {name: tok.encode(text, add_special_tokens=True).ids
           for name, text in fixture_texts().items()}
    json_path.write_text(json.dumps({
        "generator": f"scripts/make_gguf_fixtures.py ({VERSIONS})",
        "model": gguf_path.name, "tokens": len(tokens), "merges": len(merges),
        "ids": ids,
    }, ensure_ascii=False, separators=(",", ":")) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", type=Path, help="SmolLM2-135M-Instruct GGUF (get_models.sh fetches it)")
    ap.add_argument("--templates-only", action="store_true", help="write chat_templates.json only")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.templates_only:
        render_templates(OUT / "chat_templates.json")
        return
    write_dequant(OUT / "dequant.gguf")
    write_tiny(OUT / "tiny_llama.gguf", OUT / "tiny_llama.json")
    render_templates(OUT / "chat_templates.json")
    if args.smollm2:
        write_smollm2(args.smollm2, OUT / "smollm2_135m.json")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {OUT.relative_to(ROOT)}: {total / 1000:.0f} KB")


if __name__ == "__main__":
    main()
