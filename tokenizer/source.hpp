// Tokenizer files as found beside checkpoints, mapped into the normalized, versioned tokenizer
// schema that a .qf header stores (docs/FORMAT.md, "tokenizer"). Every source (tokenizer.json +
// tokenizer_config.json, a llama2.c vocabulary) becomes the same shape, so the tokenizer module
// reads one schema and never the original files' quirks.
//
// Readers treat these files as hostile: a missing model, an unknown model type, merges that name
// absent tokens, ids out of range and duplicate pieces are each one qforge::Error naming the file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace qforge {

// The end-of-turn markers of chat templates: generation stops at each one the model's template
// uses, as at EOS (every source adds them to the schema's stop_ids).
inline constexpr const char* kChatTurnEnds[] = {"<|eot_id|>", "<|im_end|>", "<|end|>",
                                                "<end_of_turn>"};

// The schema version this build writes and reads. A .qf tokenizer with another version is
// refused with a hint to reconvert.
inline constexpr int kTokenizerSchemaVersion = 2;

// U+2581 "▁", SentencePiece's space: the metaspace every SentencePiece-style schema defaults to.
inline const std::string kMetaSpace = "\xe2\x96\x81";

// The most leading spaces a Strip decoder may remove; far larger counts are not a tokenizer.
inline constexpr int64_t kMaxStrip = 1 << 20;

// `path` is a tokenizer.json (tokenizer_config.json and generation_config.json beside it are read
// too), a llama2.c tokenizer (.bin) or a GGUF model (its tokenizer.ggml.* metadata). Returns the
// normalized schema.
nlohmann::json load_tokenizer_source(const std::string& path);

// Checks the parts of a schema object every consumer relies on (version, model, pieces and the
// per-id arrays, ids in range); `source` names where it came from in errors.
void validate_tokenizer_schema(const nlohmann::json& schema, const std::string& source);

// The tokenizer that belongs to a checkpoint at `model_path` (a directory or a .safetensors or
// llama2.c .bin file): tokenizer.json in its folder, else a llama2.c tokenizer.bin or tok*.bin in
// its folder or the folder above (llama2.c models keep it there). nullopt when there is none.
std::optional<std::string> find_tokenizer(const std::string& model_path);

}  // namespace qforge
