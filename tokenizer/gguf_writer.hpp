// The normalized tokenizer schema (docs/FORMAT.md, "tokenizer") as GGUF tokenizer.ggml.*
// metadata, the inverse of tokenizer/source_gguf.cpp, for `qforge export --format gguf`:
//   bpe_byte_level    -> model "gpt2": tokens, token_type, merges, and the pre name
//                        (tokenizer.ggml.pre) whose llama.cpp pre-tokenizer is the schema's;
//   bpe_sentencepiece -> model "llama": tokens, token_type and scores. The schema ranks merges;
//                        llama.cpp (and the reader) merge by the score of the merged token, so
//                        a token gets minus the rank of the first merge that makes it, and
//                        every other token one less than the lowest: merge order is preserved.
//   llama2c           -> model "llama" with the vocabulary's own scores; run.c's pieces hold
//                        spaces where SentencePiece writes U+2581, which the export restores.
// Special ids, add_bos/add_eos and the chat template go under their tokenizer.ggml.* keys.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/gguf.hpp"

namespace qforge {

// What GGUF cannot say, with llama.cpp's own behaviour for a converted model of the family, is
// a warning: a normalizer of a byte-level model (Qwen2's NFC: llama.cpp does not normalize);
// a Metaspace pre-tokenizer (GGUF has only add_space_prefix, which prepends even to text that
// starts with a space); a llama2.c vocabulary (llama.cpp matches <s>, </s>, <unk> written in the
// text as special tokens and U+2581 as a space, run.c does neither).
struct GgufTokenizerMetadata {
    std::vector<GgufKeyValue> keys;
    std::vector<std::string> warnings;
};

// `vocab_size`: the model's embedding rows. llama.cpp requires one token per row, so a
// vocabulary with fewer tokens (padding rows) is padded as its converter does: "[PAD<id>]"
// tokens of type unused (score 0 is never a merge's). 0: no padding.
// An Error naming `source` for what GGUF cannot express at all (a byte-level pre-tokenizer
// llama.cpp has no name for).
GgufTokenizerMetadata gguf_tokenizer_metadata(const nlohmann::json& schema,
                                              const std::string& source, uint64_t vocab_size = 0);

}  // namespace qforge
