// The one check that a .qf holds a model every command can load: its config, its tensor table
// and its embedded tokenizer agree with each other and with the architecture table
// (formats/architectures.hpp). QfFile runs it at open (QfOpenOptions::check_model), so runtime,
// quantize, export, inspect, tokenize and verify all refuse the same files with the same message,
// and code past the open trusts the file's shapes and types.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>

#include "formats/model_config.hpp"

namespace qforge {

struct QfTensorInfo;

// Checks, in this order, throwing qforge::Error naming `path`, the tensor or key, and what was
// found against what was expected:
//   - the config (model_config_from_json: every key, value ranges, cross-field rules);
//   - no tensor the architecture does not have for this config (an unknown name, a layer past
//     num_hidden_layers, lm_head when the embeddings are tied, a bias without attention_bias);
//   - every tensor it requires present, with the shape its symbolic dimensions give, and a qtype
//     allowed for its kind (1-D norms and biases are float; matrices may be packed). The byte
//     length against shape x qtype is the reader's check (QfFile::parse_tensors);
//   - the embedded tokenizer, when present, has at most vocab_size tokens and names no id past
//     the embedding: ids beyond the tokenizer are padding rows (never sampled), ids beyond the
//     embedding cannot be looked up at all.
// Returns the parsed config.
ModelConfig validate_qf_model(const std::string& path, const nlohmann::json& model,
                              const nlohmann::json& tokenizer,
                              std::span<const QfTensorInfo> tensors);

// A tokenizer schema (tokenizer/source.hpp) against the model's config: more tokens than
// vocab_size, or a BOS/EOS/UNK/stop/added id at or past it, is an Error naming `tokenizer_file`
// and `model_file`. Returns how many ids of the vocabulary have no token (0 when they match).
uint64_t check_tokenizer_fits_model(const nlohmann::json& tokenizer, const ModelConfig& config,
                                    const std::string& tokenizer_file,
                                    const std::string& model_file);

// Where a tensor's decoded bytes hold a NaN or an infinity: "element 3 (row 0, column 3) is
// nan" for float tensors, "row 5, group 2: the scale is inf" for the fp16 scales of packed
// rows; nullopt when every value is finite. One pass over the bytes.
std::optional<std::string> find_non_finite(const QfTensorInfo& t, std::span<const uint8_t> bytes);

}  // namespace qforge
