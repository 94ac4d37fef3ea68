// Tokenizer files as found beside checkpoints, read into the "tokenizer" object of a .qf header.
//
// Schema (version 1; the tokenizer module defines the encoding rules that use it):
//   {"source": "llama2c", "schema_version": 1, "pieces": [...], "scores": [...],
//    "max_token_length": N, "bos_id": 1, "eos_id": 2}
//   {"source": "hf", "schema_version": 1, "tokenizer_json": {...},
//    "tokenizer_config": {...} or null}
// Pieces are stored as JSON strings, so they must be valid UTF-8.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace qforge {

// `path` is a tokenizer.json (tokenizer_config.json beside it is read too) or a llama2.c
// tokenizer (.bin). Throws qforge::Error naming the file on malformed input.
nlohmann::json load_tokenizer_source(const std::string& path);

// The tokenizer that belongs to a checkpoint at `model_path` (a directory or a .safetensors
// file): tokenizer.json in its folder, else a llama2.c tok*.bin in its folder or the folder
// above (llama2.c models keep it there). nullopt when there is none.
std::optional<std::string> find_tokenizer(const std::string& model_path);

}  // namespace qforge
