// The declarative architecture table: one row per tensor kind, naming the tensor in Hugging Face
// checkpoints and in qforge, its shape in symbolic dimensions, and when it exists. Conversion,
// loading and quantization policy all consult this table, never a list of names of their own.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/model_config.hpp"

namespace qforge {

// A symbolic dimension, resolved against a ModelConfig.
enum class Dim : uint8_t {
    none,          // pads the shape of a 1-D tensor
    vocab,         // vocab_size
    hidden,        // hidden_size
    intermediate,  // intermediate_size
    q,             // num_heads * head_dim: query projection width
    kv,            // num_kv_heads * head_dim: key/value projection width
};

// When a tensor kind exists.
enum class Presence : uint8_t {
    always,
    attention_bias,  // only when the config has q/k/v biases (qwen2; llama with attention_bias)
    untied,          // only when tie_word_embeddings is false (else lm_head reuses embed)
};

// One tensor kind. In a pattern, "{i}" stands for the layer index; rows with it repeat per layer.
struct TensorRow {
    std::string_view hf_pattern;    // "model.layers.{i}.self_attn.q_proj.weight"
    std::string_view name_pattern;  // "layers.{i}.attn.q"
    std::array<Dim, 2> shape;       // torch order [out, in]; Dim::none pads 1-D shapes
    Presence presence;
};

// One concrete tensor of a model.
struct TensorSpec {
    std::string hf_name;          // "model.layers.3.self_attn.q_proj.weight"
    std::string name;             // our name, e.g. "layers.3.attn.q"
    std::vector<uint64_t> shape;  // expected shape, torch order [out, in]
    bool is_matrix;               // a 2-D weight a quantizer may pack (embed and lm_head too)
    const TensorRow* row;         // the table row it comes from: symbolic dims, presence
};

// The rows of an architecture, in canonical order: leading global rows, then the per-layer run,
// then trailing global rows.
std::span<const TensorRow> tensor_rows(Architecture arch);

// Every tensor the model expects, in canonical order (embed, then per layer, then final_norm,
// lm_head).
std::vector<TensorSpec> expected_tensors(const ModelConfig& config);

// HF names that checkpoints carry but the model does not use (e.g. the RoPE inverse frequencies
// "model.layers.N.self_attn.rotary_emb.inv_freq" that older transformers saved).
bool is_ignorable_hf_tensor(std::string_view hf_name);

// Whether `name` matches `pattern`, where "{i}" matches a decimal layer index (no sign, no
// leading zeros); the index goes to *layer when given.
bool match_tensor_pattern(std::string_view pattern, std::string_view name,
                          uint64_t* layer = nullptr);

// The config fields a symbolic dimension comes from, with their values, for messages:
// "vocab_size 512", "num_key_value_heads 4 * head_dim 8".
std::string describe_dim(Dim d, const ModelConfig& config);

}  // namespace qforge
