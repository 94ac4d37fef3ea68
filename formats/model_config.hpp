// A Hugging Face config.json for the Llama family (llama, mistral, qwen2), read into one
// ModelConfig with every default made explicit. Hugging Face transformers is the reference for
// defaults and meaning; tests/data/configs/expected.json holds what it derives for real configs
// (scripts/make_config_fixtures.py writes it).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qforge {

// The model families we run. All share the Llama tensor layout (formats/architectures.hpp); they
// differ in config defaults and in which biases exist.
enum class Architecture : uint8_t { llama, mistral, qwen2 };

// The Hugging Face model_type: "llama", "mistral", "qwen2".
std::string_view architecture_name(Architecture arch);
// The inverse; nullopt for a model_type we do not support.
std::optional<Architecture> architecture_from_model_type(std::string_view model_type);
// "llama, mistral, qwen2", for error messages.
std::string supported_architectures();

// RoPE frequency scaling. "none" is plain RoPE (transformers' "default"); "llama3" is Llama 3.1's
// piecewise scaling: wavelengths above original_max_position_embeddings / low_freq_factor are
// divided by `factor`, those below original / high_freq_factor are kept, and the band between
// is interpolated. For "none" the numeric fields keep these neutral values.
struct RopeScaling {
    std::string type = "none";
    double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 1.0;
    uint64_t original_max_position_embeddings = 0;

    bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
    Architecture arch = Architecture::llama;
    uint64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0, num_heads = 0,
             num_kv_heads = 0, head_dim = 0, max_position_embeddings = 0;
    double rms_norm_eps = 0.0, rope_theta = 0.0;
    RopeScaling rope_scaling;
    bool tie_word_embeddings = false;
    bool attention_bias = false;  // q/k/v biases (qwen2: always; llama: "attention_bias")
    std::optional<int64_t> bos_token_id;
    std::vector<int64_t> eos_token_ids;  // eos_token_id may be an int or a list in config.json
    std::optional<uint64_t>
        sliding_window;       // recorded only (mistral; qwen2 with use_sliding_window)
    std::string torch_dtype;  // as declared ("torch_dtype" or "dtype"); "" if absent

    // Derived widths of the attention projections.
    uint64_t q_dim() const { return num_heads * head_dim; }
    uint64_t kv_dim() const { return num_kv_heads * head_dim; }

    bool operator==(const ModelConfig&) const = default;
};

// Parses a config.json object; `source` (a path) goes into every error message. Throws
// qforge::Error naming the key and what was expected for anything we cannot run faithfully.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);
// Reads and parses the file at `path`.
ModelConfig read_model_config(const std::string& path);

// The dimensions, norms and RoPE base under their config.json names (model_type, vocab_size,
// hidden_size, ... tie_word_embeddings): the keys .qf headers and Hugging Face configs share.
nlohmann::json model_dims_to_json(const ModelConfig& c);

// Our normalized form, stored in the .qf header: every field present under our own names.
nlohmann::json model_config_to_json(const ModelConfig& config);
// The inverse, equally strict (every key required, same checks); round-trips exactly.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace qforge
