// The transformer's forward pass, written once, over the operations a compute device provides
// (in the manner of llama.cpp's graph builders). The CPU and CUDA backends implement ForwardOps,
// the calibration pass (quant/block_forward.hpp) BlockOps; this file decides which
// operations run, in which order, on which activations. An architecture differs from another by
// its BlockDesc, never by a copy of this sequence. (runtime/reference_forward.cpp is a separate
// float64 implementation on purpose: it is the independent check.)
//
// One decoder block (Llama family, Hugging Face semantics):
//   h = norm(x) * attn_norm
//   q, k, v = h Wq^T (+ bq), h Wk^T (+ bk), h Wv^T (+ bv)       one shared input
//   q, k = norm(q head) * q_norm, norm(k head) * k_norm          per head, QK-norm only (qwen3)
//   att = attention(q, k, v): q, k rotated by RoPE, keys and values appended to the cache,
//         causal (and, in a layer with a sliding window W, keys at positions above pos - W),
//         each query head over its key/value head (GQA), scale 1/sqrt(head_dim)
//   x += att Wo^T                      sandwich norms (Gemma): x += norm(att Wo^T) * attn_post_norm
//   h = norm(x) * mlp_norm
//   m = act(h Wgate^T) * (h Wup^T)                               one shared input
//   x += m Wdown^T                     sandwich norms: x += norm(m Wdown^T) * mlp_post_norm
// The model: x = embed[token] (Gemma: times sqrt(hidden_size), rounded to float32); the blocks;
// logits = (norm(x) * final_norm) Wlm^T (gemma2: then soft-capped, tanh(l / cap) * cap).
// In attention, Gemma scales queries by query_pre_attn_scalar^-1/2, gemma2 soft-caps the scores
// before the mask, and gemma3's sliding layers rotate with their own RoPE base
// (ModelConfig::local_rope). Gemma's (1 + w) norms are stored as plain weights
// (formats/model_config.hpp), so the norms here are the same for every architecture.
//
// Operations name weights by role (Weight, Norm) and a layer; each implementation maps the role
// to its own storage (mapped .qf rows, device buffers, a calibration block's float copies), so
// the calibration pass can see each product's input and swap the weights it runs with.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "formats/model_config.hpp"

namespace qforge {

// The matrices of the forward pass: a block's linears, and the output head (layer ignored).
enum class Weight : uint8_t { q, k, v, o, gate, up, down, lm_head };
inline constexpr int kBlockLinears = 7;  // q .. down

// The norm weights: a block's two, the final one (layer ignored), the per-head q and k norms
// of QK-norm architectures, and the post-norms of sandwich-norm ones (Gemma).
enum class Norm : uint8_t { attn, mlp, final, q, k, attn_post, mlp_post };
inline constexpr int kNorms = 7;

// What a norm normalizes in each token's row: `groups` consecutive vectors of `width` (the
// hidden state: one of hidden_size; q and k: one per head of head_dim), each with the same
// weight of `width`.
struct NormShape {
    uint64_t width, groups;
};
NormShape norm_shape(const ModelConfig& config, Norm which);

// The gated MLP's activation: m = act(gate) * up. gelu_tanh: 0.5 x (1 + tanh(sqrt(2 / pi)
// (x + 0.044715 x^3))), PyTorch's gelu(approximate="tanh").
enum class Activation : uint8_t { silu, gelu_tanh };
inline float gelu_tanh(float v) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
}

// What one architecture's block computes beyond the shared sequence above.
struct BlockDesc {
    bool qkv_bias = false;  // q, k and v add their biases (qwen2; llama with attention_bias)
    bool qk_norm = false;   // q and k heads RMS-normalized before RoPE (qwen3, gemma3)
    Activation activation = Activation::silu;
    bool sandwich_norms = false;  // post-norms on the attention and MLP outputs (Gemma)
    float embed_scale = 0.0f;     // > 0: embeddings times this (Gemma: sqrt(hidden) in float32)
    float final_softcap = 0.0f;   // > 0: logits soft-capped (gemma2)
    // Attention: the query scale, and > 0: scores soft-capped before the mask (gemma2).
    float query_scale = 0.0f;
    float attn_softcap = 0.0f;
};

// The block of a model's architecture and configuration (formats/model_config.hpp).
BlockDesc block_desc(const ModelConfig& config);

// Rows of activations: token t's row starts at data + t * ld.
struct Rows {
    float* data = nullptr;
    uint64_t ld = 0;
    Rows at(uint64_t column) const { return {data + column, ld}; }
};

// One product of a shared input: out (=, or += when accumulate: the residual add) in W^T, plus
// W's bias when `bias`.
struct Product {
    Weight weight;
    Rows out;
    bool accumulate = false;
    bool bias = false;
};

// The operations of a block (and of the final norm and output head).
class BlockOps {
  public:
    virtual ~BlockOps() = default;
    // out = norm(in) * weight, n tokens, in the groups of norm_shape(which); out may be in.
    virtual void norm(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) = 0;
    // Every product of `products` on the same n input rows.
    virtual void products(uint64_t layer, Rows in, std::span<const Product> products,
                          uint64_t n) = 0;
    // out += norm(in) * weight (a post-norm's residual add); out is not in.
    virtual void norm_add(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) = 0;
    // RoPE on q and k, keys and values stored, causal attention of the n tokens -> out, within
    // the layer's window (ModelConfig::attention_window), with the BlockDesc's query scale and
    // score soft-capping.
    virtual void attention(uint64_t layer, Rows q, Rows k, Rows v, Rows out, uint64_t n) = 0;
    // out = act(in Wgate^T) * (in Wup^T), n tokens.
    virtual void gated_products(uint64_t layer, Rows in, Activation act, Rows out, uint64_t n) = 0;
};

// A whole model's: the block's and the embedding lookup.
class ForwardOps : public BlockOps {
  public:
    // out = rows of the embedding for tokens[0 .. n), read from the memory the implementation
    // computes in (host memory for the CPU; the CUDA engine's device buffer of the step).
    virtual void embed(const int32_t* tokens, uint64_t n, Rows out) = 0;
    // rows[t][0 .. width) *= s, n rows.
    virtual void scale(Rows rows, uint64_t n, uint64_t width, float s) = 0;
    // rows[t][0 .. width) = tanh(v / cap) * cap, n rows.
    virtual void softcap(Rows rows, uint64_t n, uint64_t width, float cap) = 0;
};

// The activations a block reads and writes: x the residual stream (updated in place), h the
// normalized input, q/k/v and att the attention's, mlp the gated product's.
struct BlockActivations {
    Rows x, h, q, k, v, att, mlp;
};

// q, k, v from `in`, then attention into a.att (the first half of the attention sublayer).
void block_attend(BlockOps& ops, const BlockDesc& desc, uint64_t layer, Rows in,
                  const BlockActivations& a, uint64_t n);
// out (=, or += when accumulate) down(act(gate in) * up in), through a.mlp.
void block_mlp(BlockOps& ops, const BlockDesc& desc, uint64_t layer, Rows in, Rows out,
               bool accumulate, const BlockActivations& a, uint64_t n);
// One decoder block on a.x in place.
void run_block(BlockOps& ops, const BlockDesc& desc, uint64_t layer, const BlockActivations& a,
               uint64_t n);

// The whole model on n tokens: embeddings into a.x, every block, then (when logits_from < n) the
// final norm and the output head for tokens [logits_from, n) into `logits`, through a.h.
void run_model(ForwardOps& ops, const BlockDesc& desc, uint64_t layers, const int32_t* tokens,
               uint64_t n, const BlockActivations& a, uint64_t logits_from, Rows logits);

}  // namespace qforge
