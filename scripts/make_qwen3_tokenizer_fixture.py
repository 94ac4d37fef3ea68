#!/usr/bin/env python3
"""Writes tests/data/tokenizers/qwen3/: a Qwen3-style tokenizer and the ids PyPI `tokenizers`
gives for it.

Qwen3's tokenizer.json is Qwen2's byte-level BPE (NFC, Split with Qwen2's regex, ByteLevel)
with 26 added tokens after the vocabulary: 14 special ones (<|endoftext|>, <|im_start|>,
<|im_end|>, the vision and object markers) and 12 that are not special (<tool_call>, <think>,
</think>, the FIM and repository markers), which decoding with skip_special keeps. Its
tokenizer_config.json has no BOS, <|im_end|> as EOS and the Qwen3 chat template. The real files
(151,669 tokens, 11 MB) are too large to commit; this takes the trained vocabulary of the qwen2
fixture family (scripts/make_tokenizer_fixtures.py) and gives it Qwen3's added tokens, flags,
configuration and template (scripts/chat_templates/qwen3.jinja), so every part but the
vocabulary's size is Qwen3's.

    /work/venv/bin/python scripts/make_qwen3_tokenizer_fixture.py [--shared ../shared/data]

expected.json has the format of the other families (tests/data/tokenizers/README.md) for every
text of texts.json, plus "extra": Qwen3-specific texts written here, with their text inline.
"""
import argparse
import json
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "tokenizers"
OUT = FIXTURES / "qwen3"

# Qwen3's added tokens in their order (ids 151643.. in the real file), and whether special.
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
         ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
         ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
         ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
         ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
         ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
         ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
         ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
         ("<think>", False), ("</think>", False)]

EXTRA = {
    "qwen3-chat": "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n",
    "qwen3-tools": "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"
                   "<tool_response>\nok\n</tool_response>",
    "qwen3-fim": "<|repo_name|>qforge<|file_sep|>a.py\n<|fim_prefix|>def f():<|fim_suffix|>"
                 "\n<|fim_middle|>    return 1<|fim_pad|>",
    "qwen3-markers": "<|vision_start|><|image_pad|><|vision_end|><|box_start|>(1,2)<|box_end|>"
                     "<|quad_start|><|quad_end|><|object_ref_start|>cat<|object_ref_end|><|video_pad|>",
    "qwen3-partial": "<think <|im_start| </think>> <|endoftext|><|endoftext|>think>",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    args = ap.parse_args()

    j = json.loads((FIXTURES / "qwen2" / "tokenizer.json").read_text())
    first = len(j["model"]["vocab"])
    j["added_tokens"] = [{"id": first + i, "content": content, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": special}
                         for i, (content, special) in enumerate(ADDED)]
    config = {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None,
        "chat_template": (ROOT / "scripts" / "chat_templates" / "qwen3.jinja").read_text(),
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }
    tok = Tokenizer.from_str(json.dumps(j))  # the reference must accept the file as written

    def row(name, text):
        plain = tok.encode(text, add_special_tokens=False).ids
        return {"name": name, "ids": tok.encode(text, add_special_tokens=True).ids,
                "ids_no_special": plain,
                "decoded_skip_special": tok.decode(plain, skip_special_tokens=True),
                "roundtrip": tok.decode(plain, skip_special_tokens=False) == text,
                "words": [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(text)]}

    cases = []
    for t in json.loads((FIXTURES / "texts.json").read_text())["texts"]:
        if "shared" in t:
            ref = t["shared"]
            data = (args.shared / ref["file"]).read_bytes()[ref["offset"]:ref["offset"] + ref["length"]]
            text = data.decode("utf-8")
        else:
            text = t["text"]
        cases.append(row(t["name"], text))
    extra = [dict(row(name, text), text=text) for name, text in EXTRA.items()]

    OUT.mkdir(parents=True, exist_ok=True)
    dump = lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")) + "\n"
    (OUT / "tokenizer.json").write_text(dump(j))
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1) + "\n")
    (OUT / "expected.json").write_text(json.dumps({
        "family": "qwen3", "generator": f"scripts/make_qwen3_tokenizer_fixture.py (tokenizers "
                                        f"{tokenizers.__version__})",
        "vocab_size": tok.get_vocab_size(), "pre_tokenizer": j["pre_tokenizer"], "cases": cases,
        "extra": extra}, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
