// The tokenizer a GGUF file carries in its metadata (tokenizer.ggml.*), mapped into the
// normalized schema (docs/FORMAT.md, "tokenizer"), as llama.cpp's src/llama-vocab.cpp reads the
// same keys:
//   tokenizer.ggml.model       "gpt2": byte-level BPE (tokens, merges, and a named pre-tokenizer
//                              in tokenizer.ggml.pre); "llama": SentencePiece (tokens, scores,
//                              byte-fallback <0xXX> tokens, a "▁" space), mapped to the
//                              SentencePiece-style BPE that `tokenizers` builds from the same
//                              vocabulary (merges ordered by score)
//   tokenizer.ggml.tokens, token_type, merges, scores
//   tokenizer.ggml.bos_token_id, eos_token_id, unknown_token_id, eot_token_id, eom_token_id
//   tokenizer.ggml.add_bos_token, add_eos_token, add_space_prefix
//   tokenizer.chat_template
// An unknown model or pre-tokenizer name, or a missing pre-tokenizer, is an Error naming the
// file and the supported names: guessing would tokenize differently from the model's training.
#pragma once

#include <nlohmann/json.hpp>

#include "formats/gguf.hpp"

namespace qforge {

nlohmann::json tokenizer_schema_from_gguf(const GgufFile& file);

}  // namespace qforge
