#!/usr/bin/env python3
"""Writes the Gemma tokenizer fixtures in tests/data/gguf/:

  tiny_gemma_tokenizer.gguf   (always) a "gemma3" GGUF with a tokenizer and no tensors: 330
                              tokens laid out as Gemma's are (control tokens, user-defined
                              newline, space, tab and HTML tokens, 256 byte tokens, then normal
                              pieces whose scores disagree with their order), written with PyPI
                              gguf; and tiny_gemma_tokenizer.json, the ids the references below
                              give for texts that exercise each rule, and the tokenizer.json and
                              tokenizer_config.json transformers saved for it (qforge must read
                              that path too)
  gemma3_270m.json            (with the model's GGUF) the token ids of Gemma 3 270M's tokenizer
                              (the 262,144-piece vocabulary of gemma-3-270m-q4_k_m.gguf, which
                              scripts/get_models.sh gemma3 fetches)

The references build the tokenizer from a GGUF as users do:

  - transformers builds the tokenizer from the GGUF (AutoTokenizer.from_pretrained(dir,
    gguf_file=...): integrations/gguf's gemma_tokenizer), and saves it as tokenizer.json;
  - the PyPI `tokenizers` package loads that tokenizer.json on its own; both must give the same
    ids for every text (the script stops otherwise), and those ids are written.

Texts: the inline texts of tests/data/tokenizers/texts.json, Gemma-specific texts written here
(control and user-defined tokens, whitespace runs, tabs, HTML tags, byte fallback), the Gemma 3
chat prompt rendered by transformers' apply_chat_template, and excerpts of ../shared/data. The
shared prose may not be copied into the repository (its README), and its ids would be a copy:
for those only the excerpt's place (file, offset, length, SHA-256 and XXH3-64 of its bytes), the
id count and the XXH3-64 of the ids (int32 little-endian; what qforge's core/hash.hpp computes)
are written.

    /work/venv/bin/python scripts/make_gemma3_fixtures.py [models/gemma-3-270m-q4_k_m.gguf]

(torch-free: transformers, tokenizers, gguf, jinja2 and xxhash are what it imports). About 2
minutes with the model, seconds without.
"""
import argparse
import hashlib
import json
import struct
import sys
import tempfile
from pathlib import Path

import gguf
import tokenizers
import transformers
import xxhash
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "gguf" / "gemma3_270m.json"
TINY = ROOT / "tests" / "data" / "gguf" / "tiny_gemma_tokenizer"
TEXTS = ROOT / "tests" / "data" / "tokenizers" / "texts.json"
SHARED = ROOT.parent / "shared" / "data"
# The GGUF carries no chat template; Gemma 3's own is rendered (scripts/chat_templates/).
GEMMA3 = (ROOT / "scripts" / "chat_templates" / "gemma3.jinja").read_text()

GEMMA_TEXTS = {
    "gemma-control": "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
                     "<bos><eos><pad><unk><mask>[multimodal]<unused0><unused6241><start_of_image>"
                     "<end_of_image>",
    "gemma-control-partial": "<start_of_turn <end_of_turn>> <bos <0x41> <unused99 <unused",
    "gemma-whitespace": "a  b   c    d\t\te\t\t\tf\n\n\ng  \n  h" + " " * 31 + "i" + " " * 40 +
                        "j" + "\t" * 35 + "k" + "\n" * 33 + "l",
    "gemma-leading-spaces": "  Hello  ",
    "gemma-one-leading-space": " Hello",
    "gemma-html": "<table><tr><td>1</td></tr></table> <h1>Title</h1><strong>x</strong>"
                  "<a>link</a><div><span>s</span></div> </p>",
    "gemma-byte-fallback": "\x01\x7f \ue000 \U000f0000 \U00020b9f \u0378 \u2028 \ufffd",
    "gemma-prose": "The quick brown fox jumps over the lazy dog. It wasn't the first time; the "
                   "dog, having seen 3,141 foxes since 2019, didn't even look up.",
    "gemma-markdown": "# Title\n\n- item **bold** and `code`\n\n```python\nprint('hi')\n```\n",
}

# Excerpts of ../shared/data by (file, offset, length); the whole wikitext-2 test text is the one
# `qforge ppl` scores.
SHARED_TEXTS = {
    "wikitext-2-test": ("wikitext-2-raw/wiki.test.lf.raw", 0, None),
    "austen-emma": ("austen/emma.txt", 0, 60000),
    "brown": ("brown-corpus/brown.txt", 100000, 60000),
    "tinystories": ("tinystories-val-sample/tinystories_val_sample.txt", 0, 40000),
}

CHAT = [
    ("chat-user", "", "What is the capital of France?"),
    ("chat-system-user", "You are terse.", "  Name three colours.  "),
]


# The tiny vocabulary: Gemma's layout in miniature. Normal pieces get scores that disagree with
# their order (Gemma's merges follow the order), and the respelled space tokens and "\n" runs
# must win over normal pieces holding the same characters.
TINY_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
TINY_USER = ["[multimodal]", "\n", "\n\n", "\n\n\n", "  ", "   ", "    ", "\t", "\t\t", "<b>", "</b>"]
TINY_TURNS = ["<start_of_turn>", "<end_of_turn>"]
TINY_NORMAL = (list("\u2581abcdefghijklmnopqrstuvwxyz.,!?'0123456789") + ["\u00e9", "\u4e16"] +
               ["th", "he", "\u2581t", "\u2581th", "the", "\u2581the", "in", "\u2581in", "ing", "er",
                "\u2581w", "or", "ld", "\u2581wor", "\u2581world", "\u2581h", "el", "lo", "ll", "ello",
                "\u2581hello", "hello", "\u2581\u2581t", "e\u2581", "\u2581a", "an", "\u2581an", "and",
                "\u2581and", "12", "123", "\u2581\u2581the", "o\u2581w"])
TINY_TEXTS = {
    "words": "the world and hello",
    "no-prefix": "hello the",
    "leading-spaces": "  hello",
    "space-runs": "the  the   the    world     and",
    "newlines": "a\nb\n\nc\n\n\n\nd",
    "tabs": "\t\tx\t\t\ty",
    "html": "<b>bold</b> <b",
    "turns": "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "control": "<bos><eos><pad><unk><mask>[multimodal]",
    "byte-fallback": "caf\u00e9 \u4e16\u754c \U0001f600 \u00fc",
    "digits": "123 1234 0.5",
    "end-space": "world ",
    "empty": "",
}


def write_tiny():
    pieces = TINY_CONTROL + TINY_USER[:1] + TINY_TURNS + TINY_USER[1:]
    types = [3] * len(TINY_CONTROL) + [4] + [3] * len(TINY_TURNS) + [4] * (len(TINY_USER) - 1)
    scores = [0.0] * len(pieces)
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    scores += [0.0] * 256
    for i, p in enumerate(TINY_NORMAL):
        pieces.append(p)
        types.append(1)
        scores.append(-float((i * 37) % len(TINY_NORMAL)))  # a shuffled rank
    w = gguf.GGUFWriter(str(TINY.with_suffix(".gguf")), "gemma3")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    hf = AutoTokenizer.from_pretrained(str(TINY.parent), gguf_file=TINY.with_suffix(".gguf").name)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        saved = json.loads((Path(tmp) / "tokenizer.json").read_text())
        saved_config = json.loads((Path(tmp) / "tokenizer_config.json").read_text())
        tk = tokenizers.Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
    cases = {}
    for name, text in TINY_TEXTS.items():
        a = hf(text).input_ids
        b = tk.encode(text).ids
        if a != b:
            sys.exit(f"tiny: transformers and tokenizers disagree on {text!r}")
        plain = tk.encode(text, add_special_tokens=False).ids
        cases[name] = {"text": text, "ids": a, "ids_no_special": plain,
                       "decoded": tk.decode(plain, skip_special_tokens=False)}
    TINY.with_suffix(".json").write_text(json.dumps({
        "generator": f"scripts/make_gemma3_fixtures.py (gguf, transformers {transformers.__version__}, "
                     f"tokenizers {tokenizers.__version__})",
        "vocab_size": len(pieces), "merges": len(saved["model"]["merges"]), "cases": cases,
        "tokenizer_json": saved, "tokenizer_config_json": saved_config,
    }, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {TINY.with_suffix('.gguf').relative_to(ROOT)} and .json")


def ids_xxh3_64(ids):
    return xxhash.xxh3_64_hexdigest(struct.pack(f"<{len(ids)}i", *ids))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", type=Path, nargs="?", help="gemma-3-270m-q4_k_m.gguf")
    args = ap.parse_args()
    write_tiny()
    if not args.gguf:
        return

    hf = AutoTokenizer.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        tk = tokenizers.Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))

    def encode(text, special=True):
        a = hf(text, add_special_tokens=special).input_ids
        b = tk.encode(text, add_special_tokens=special).ids
        if a != b:
            sys.exit(f"transformers and tokenizers disagree on {text[:60]!r}")
        return a

    texts = {t["name"]: t["text"] for t in json.loads(TEXTS.read_text())["texts"] if "text" in t}
    texts.update(GEMMA_TEXTS)
    ids = {name: encode(text) for name, text in texts.items()}
    ids_no_special = {name: encode(text, False) for name, text in GEMMA_TEXTS.items()}

    hf.chat_template = GEMMA3
    chat = {}
    for name, system, user in CHAT:
        messages = ([{"role": "system", "content": system}] if system else []) + \
                   [{"role": "user", "content": user}]
        text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        chat[name] = {"system": system, "user": user, "text": text, "ids": encode(text, False)}

    shared = {}
    for name, (file, offset, length) in SHARED_TEXTS.items():
        data = (SHARED / file).read_bytes()
        part = data[offset:] if length is None else data[offset:offset + length]
        text = part.decode("utf-8")  # the excerpts are cut at character boundaries
        got = encode(text)
        shared[name] = {"file": file, "offset": offset, "length": len(part),
                        "sha256": hashlib.sha256(part).hexdigest(),
                        "xxh3_64": xxhash.xxh3_64_hexdigest(part), "count": len(got),
                        "ids_xxh3_64": ids_xxh3_64(got)}

    OUT.write_text(json.dumps({
        "generator": f"scripts/make_gemma3_fixtures.py (transformers {transformers.__version__}, "
                     f"tokenizers {tokenizers.__version__})",
        "model": args.gguf.name, "vocab_size": len(hf), "bos_id": hf.bos_token_id,
        "eos_id": hf.eos_token_id, "texts": GEMMA_TEXTS, "ids": ids,
        "ids_no_special": ids_no_special, "chat": chat, "shared": shared,
    }, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {OUT.stat().st_size / 1000:.0f} KB")


if __name__ == "__main__":
    main()
