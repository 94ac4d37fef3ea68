// A Hugging Face config.json for the Llama family (llama, mistral, qwen2, qwen3) and Gemma 2/3
// (gemma2, gemma3_text), read into one
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

// The model families we run. The Llama family shares the Llama tensor layout
// (formats/architectures.hpp) and differs in config defaults, in which biases exist and in
// qwen3's per-head q/k norms; Gemma adds sandwich norms (ArchitectureFeatures).
enum class Architecture : uint8_t { llama, mistral, qwen2, qwen3, gemma2, gemma3 };

// The Hugging Face model_type: "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text".
std::string_view architecture_name(Architecture arch);
// The inverse; nullopt for a model_type we do not support.
std::optional<Architecture> architecture_from_model_type(std::string_view model_type);
// "llama, mistral, qwen2, qwen3", for error messages.
std::string supported_architectures();
// transformers' model class of the architecture ("LlamaForCausalLM", ...).
std::string_view architecture_hf_class(Architecture arch);
// Whether the architecture RMS-normalizes each query and key head before RoPE (qwen3's q_norm
// and k_norm, one weight of head_dim per layer each).
bool architecture_has_qk_norm(Architecture arch);

// What an architecture's forward pass does beyond the Llama block, as transformers' modeling code
// does it (runtime/transformer.hpp's BlockDesc is made from these and the config).
struct ArchitectureFeatures {
    bool qk_norm = false;           // q_norm / k_norm per head before RoPE (qwen3, gemma3)
    bool gelu_tanh = false;         // GeGLU with tanh-approximated GELU, not SwiGLU (gemma)
    bool scaled_embedding = false;  // embeddings times sqrt(hidden_size) in float32 (gemma)
    bool sandwich_norms = false;    // post-norms on the attention and MLP outputs (gemma)
    // Hugging Face checkpoints store each RMSNorm weight as w and apply (1 + w) (GemmaRMSNorm, in
    // float32). A .qf stores the multiplier 1 + w itself, as float32 (llama.cpp's converter
    // stores it too), so every backend and AWQ's folding treat it as a plain norm weight.
    bool norm_plus_one = false;
};
const ArchitectureFeatures& architecture_features(Architecture arch);

// RoPE frequency scaling. "none" is plain RoPE (transformers' "default"); "linear" divides every
// frequency by `factor` (Gemma 3's global layers); "llama3" is Llama 3.1's piecewise scaling:
// wavelengths above original_max_position_embeddings / low_freq_factor are divided by `factor`,
// those below original / high_freq_factor are kept, and the band between is interpolated. For
// "none" the numeric fields keep these neutral values.
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
    // Sliding-window attention: a query at position p attends to keys at positions above
    // p - sliding_window (itself and the sliding_window - 1 before it), in layers numbered
    // max_window_layers and up (Qwen2/3's max_window_layers; 0 for mistral: every layer).
    std::optional<uint64_t> sliding_window;
    uint64_t max_window_layers = 0;
    std::string torch_dtype;  // as declared ("torch_dtype" or "dtype"); "" if absent
    // Gemma. Layers whose index i has (i + 1) % sliding_window_pattern == 0 attend fully, the
    // others within sliding_window (0: every layer windowed; gemma2 2, gemma3 6).
    uint64_t sliding_window_pattern = 0;
    double query_pre_attn_scalar = 0.0;    // the query scale is its ^-1/2; 0: head_dim's
    double attn_logit_softcapping = 0.0;   // scores tanh(s / cap) * cap before the mask; 0: none
    double final_logit_softcapping = 0.0;  // the same on the logits; 0: none
    // > 0: the RoPE base of the sliding-window layers, which take no rope_scaling (gemma3's
    // rope_local_base_freq); rope_theta and rope_scaling are then the full layers'.
    double rope_local_theta = 0.0;

    // Derived widths of the attention projections.
    uint64_t q_dim() const { return num_heads * head_dim; }
    uint64_t kv_dim() const { return num_kv_heads * head_dim; }
    // The attention window of a layer: sliding_window where it applies, else 0 (causal only).
    uint64_t attention_window(uint64_t layer) const {
        if (!sliding_window || layer < max_window_layers) return 0;
        if (sliding_window_pattern && (layer + 1) % sliding_window_pattern == 0) return 0;
        return *sliding_window;
    }
    // Whether a layer rotates with rope_local_theta (and no rope_scaling).
    bool local_rope(uint64_t layer) const {
        return rope_local_theta > 0.0 && attention_window(layer) != 0;
    }
    // The attention's query scale: query_pre_attn_scalar^-1/2, else head_dim^-1/2.
    double query_scale() const;

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

// The config.json keys of the architecture's bias and window rules, as transformers spells them
// for its config class (llama: attention_bias, mlp_bias; mistral: sliding_window; qwen2/qwen3:
// use_sliding_window with sliding_window and max_window_layers; qwen3: attention_bias), so that
// parse_model_config reads them back to the same values.
nlohmann::json hf_architecture_keys(const ModelConfig& c);

// Our normalized form, stored in the .qf header: every field present under our own names.
nlohmann::json model_config_to_json(const ModelConfig& config);
// The inverse, equally strict (every key required, same checks); round-trips exactly.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace qforge
