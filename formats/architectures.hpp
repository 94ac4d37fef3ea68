// The declarative architecture table, the one source of tensor facts: one row per tensor kind,
// naming the tensor in qforge, in Hugging Face checkpoints, in GGUF files (llama.cpp's names) and
// in llama2.c checkpoints (run.c's field), with its shape in symbolic dimensions, when it exists,
// the RoPE row reordering its q/k rows need when the input rotates adjacent pairs, and its class
// (embedding, output head, attention or MLP linear, norm, bias) with the least precision it may
// be stored in. Every input kind (sources/), the loader (runtime/model.cpp), the .qf validator and
// the quantization recipe consult this table, never a list of names of their own.
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
    head_dim,      // head_dim: one attention head
};

// When a tensor kind exists.
enum class Presence : uint8_t {
    always,
    attention_bias,  // only when the config has q/k/v biases (qwen2; llama with attention_bias)
    untied,          // only when tie_word_embeddings is false (else lm_head reuses embed)
    qk_norm,         // only for architectures that normalize q/k heads (qwen3, gemma3)
};

// Which tensor of the model a row is: what the runtime loads it as (runtime/model.cpp).
enum class TensorKind : uint8_t {
    embed,
    attn_norm,
    attn_q,
    attn_k,
    attn_v,
    attn_o,
    attn_q_bias,
    attn_k_bias,
    attn_v_bias,
    attn_q_norm,
    attn_k_norm,
    attn_post_norm,  // Gemma's norm of the attention output, before the residual add
    mlp_norm,
    mlp_gate,
    mlp_up,
    mlp_down,
    mlp_post_norm,  // Gemma's norm of the MLP output, before the residual add
    final_norm,
    lm_head,
};
// The kinds only sandwich-norm layouts (Gemma) have; every layout has every other kind once.
constexpr bool tensor_kind_optional(TensorKind k) {
    return k == TensorKind::attn_post_norm || k == TensorKind::mlp_post_norm;
}

// What a tensor does, for storage rules and quantization policy (quant/recipe.cpp).
enum class WeightClass : uint8_t {
    embedding,         // a row lookup (and, when tied, also the output head)
    output_head,       // the logits' projection
    attention_linear,  // q, k, v, o
    mlp_linear,        // gate, up, down
    norm,              // RMSNorm weights (the per-head q/k norms too)
    bias,              // q/k/v biases
};

// The least precision a tensor may be stored in.
enum class LeastPrecision : uint8_t {
    float16,    // a float type (f16, bf16 or f32), never packed rows: 1-D, and the runtime
                // converts it to f32 at load, so quantizing it would save nothing
    any_qtype,  // any type of formats/qtype.hpp, down to its fewest bits: a matrix of rows
};

struct WeightClassInfo {
    WeightClass cls;
    std::string_view name;  // as `quantize --help` spells it
    LeastPrecision least;
    std::string_view what;  // what its tensors are, in words
};
// One row per class, in enum order (static checks in architectures.cpp).
const WeightClassInfo& weight_class_info(WeightClass c);
std::span<const WeightClassInfo> weight_classes();

// How an input that rotates adjacent pairs (2i, 2i+1) of each head (llama2.c; llama.cpp's
// "llama" GGUF, LLAMA_ROPE_TYPE_NORM) stored a q or k projection: its rows are reordered back to
// Hugging Face's rotate-half layout per head of this count (sources/source_common.hpp).
enum class RopeRows : uint8_t { none, q_heads, kv_heads };

// One tensor kind. In a pattern, "{i}" stands for the layer index; rows with it repeat per layer.
struct TensorRow {
    TensorKind kind;
    std::string_view hf_pattern;     // "model.layers.{i}.self_attn.q_proj.weight"
    std::string_view name_pattern;   // "layers.{i}.attn.q"
    std::string_view gguf_pattern;   // llama.cpp's name: "blk.{i}.attn_q.weight"
    std::string_view llama2c_field;  // run.c's TransformerWeights field ("wq"); "" when none
    std::array<Dim, 2> shape;        // torch order [out, in]; Dim::none pads 1-D shapes
    Presence presence;
    RopeRows rope;
    WeightClass cls;
};

// One concrete tensor of a model.
struct TensorSpec {
    std::string hf_name;          // "model.layers.3.self_attn.q_proj.weight"
    std::string name;             // our name, e.g. "layers.3.attn.q"
    std::vector<uint64_t> shape;  // expected shape, torch order [out, in]
    bool is_matrix;               // a 2-D weight a quantizer may pack (embed and lm_head too)
    const TensorRow* row;         // the table row it comes from: symbolic dims, presence
    uint64_t layer = 0;           // its layer (0 for the global rows)
    // Stored inside a fused checkpoint tensor (fused_part below): hf_name names that tensor,
    // and this one is its rows [fused_row0, fused_row0 + shape[0]) of fused_rows in all.
    uint64_t fused_row0 = 0, fused_rows = 0;  // fused_rows 0: stored on its own
};

// A tensor a Hugging Face checkpoint of the architecture stores inside a fused one, its rows
// concatenated with its siblings' (Phi-3's self_attn.qkv_proj: q, k, v; mlp.gate_up_proj: gate,
// up). Conversion splits it by rows (sources/hf_source.cpp, sources/gguf.cpp), so the model and
// every .qf hold the separate tensors of the table above.
struct FusedPart {
    Architecture arch;
    TensorKind kind;
    std::string_view hf_pattern;  // the fused tensor: "model.layers.{i}.self_attn.qkv_proj.weight"
    std::string_view gguf_pattern;  // llama.cpp's name of it: "blk.{i}.attn_qkv.weight"
    std::array<Dim, 2> offset;      // summed: the fused rows before this part
    std::array<Dim, 3> total;       // summed: the fused tensor's rows
};
// The part `kind` of `arch` is stored as; nullptr when it is stored on its own.
const FusedPart* fused_part(Architecture arch, TensorKind kind);
// Whether any tensor of `arch` is stored fused (an exporter writing separate tensors refuses it).
bool architecture_has_fused_tensors(Architecture arch);

// The rows of an architecture, in canonical order: leading global rows, then the per-layer run,
// then trailing global rows.
std::span<const TensorRow> tensor_rows(Architecture arch);

// Every tensor the model expects, in canonical order (embed, then per layer, then final_norm,
// lm_head).
std::vector<TensorSpec> expected_tensors(const ModelConfig& config);

// The row whose qforge name pattern `name` matches, in any architecture's layout (every layout
// names a kind alike); nullptr for a name no row has. *layer gets the layer index when given.
const TensorRow* find_tensor_row(std::string_view name, uint64_t* layer = nullptr);

// A row's facts resolved against a config: whether the model has it, its shape (torch order,
// [n] for vectors) and whether it repeats per layer.
bool tensor_row_present(const TensorRow& row, const ModelConfig& config);
std::vector<uint64_t> tensor_row_shape(const TensorRow& row, const ModelConfig& config);
bool tensor_row_per_layer(const TensorRow& row);

// "{i}" replaced by `layer` in a row's pattern.
std::string tensor_name_for_layer(std::string_view pattern, uint64_t layer);

// Whether the architecture's Hugging Face checkpoints store its RMSNorm weights (class norm) as
// w applied as (1 + w): its sources add 1 (formats/model_config.hpp, ArchitectureFeatures).
bool hf_norms_plus_one(Architecture arch);

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
