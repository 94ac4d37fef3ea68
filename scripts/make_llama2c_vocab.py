#!/usr/bin/env python3
"""Writes a llama2.c tokenizer file (tokenizer.bin format) of N tokens, learned here.

    scripts/make_llama2c_vocab.py TEXT OUT.bin [N]      (default N = 512)

Layout of the file (run.c's build_tokenizer): int32 max_token_length, then per token a float32
score, an int32 byte length and the bytes. The tokens are those of llama2.c's exports: <unk>,
"\\n<s>\\n", "\\n</s>\\n", the 256 byte-fallback tokens <0x00>..<0xFF>, then BPE merges learned on
TEXT's words (each with its leading space, as SentencePiece's dummy prefix gives it) with scores
0, -1, -2, ... in the order they were learned, then every printable ASCII character not yet a
token, scored below the merges. Used for tests/data/quant_checkpoints/tok512.bin (trained on
docs/FORMAT.md): a vocabulary written by this project, so no file of ../shared is copied.
"""
import collections
import struct
import sys


def learn(text, merges_wanted):
    words = collections.Counter(" " + w for w in text.split())
    seqs = {w: list(w) for w in words}
    vocab = []
    for _ in range(merges_wanted):
        pairs = collections.Counter()
        for w, n in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[a, b] += n
        if not pairs:
            break
        # The most frequent pair; ties by the pair itself, so the result is deterministic.
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        vocab.append(a + b)
        for w in words:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return vocab


def main():
    text = open(sys.argv[1], encoding="utf-8").read()
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    fixed = ["<unk>", "\n<s>\n", "\n</s>\n"] + ["<0x%02X>" % b for b in range(256)]
    chars = [chr(c) for c in range(32, 127)]
    tokens = fixed + learn(text, n - len(fixed) - len(chars)) + chars  # merges are >= 2 chars
    assert len(tokens) == n and len(set(tokens)) == n, (len(tokens), len(set(tokens)))
    scores = [0.0] * len(fixed) + [-float(i) for i in range(n - len(fixed))]
    data = [t.encode("utf-8") for t in tokens]
    with open(sys.argv[2], "wb") as f:
        f.write(struct.pack("<i", max(len(d) for d in data)))
        for s, d in zip(scores, data):
            f.write(struct.pack("<fi", s, len(d)))
            f.write(d)


if __name__ == "__main__":
    main()
