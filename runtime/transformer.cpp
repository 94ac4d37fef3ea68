#include "runtime/transformer.hpp"

#include <cmath>

namespace qforge {

BlockDesc block_desc(const ModelConfig& config) {
    const ArchitectureFeatures& f = architecture_features(config.arch);
    BlockDesc d;
    d.qkv_bias = config.attention_bias;
    d.qk_norm = f.qk_norm;
    // llama, mistral, qwen2, qwen3: SwiGLU; Gemma: GeGLU.
    d.activation = f.gelu_tanh ? Activation::gelu_tanh : Activation::silu;
    d.sandwich_norms = f.sandwich_norms;
    // Gemma's normalizer, hidden_size**0.5 as a tensor of the activations' dtype (float32 here).
    if (f.scaled_embedding)
        d.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(config.hidden_size)));
    d.final_softcap = static_cast<float>(config.final_logit_softcapping);
    d.query_scale = static_cast<float>(config.query_scale());
    d.attn_softcap = static_cast<float>(config.attn_logit_softcapping);
    return d;
}

NormShape norm_shape(const ModelConfig& config, Norm which) {
    switch (which) {
        case Norm::q:
            return {config.head_dim, config.num_heads};
        case Norm::k:
            return {config.head_dim, config.num_kv_heads};
        default:
            return {config.hidden_size, 1};
    }
}

void block_attend(BlockOps& ops, const BlockDesc& desc, uint64_t layer, Rows in,
                  const BlockActivations& a, uint64_t n) {
    const Product qkv[] = {
        {Weight::q, a.q, false, desc.qkv_bias},
        {Weight::k, a.k, false, desc.qkv_bias},
        {Weight::v, a.v, false, desc.qkv_bias},
    };
    ops.products(layer, in, qkv, n);
    if (desc.qk_norm) {
        ops.norm(layer, Norm::q, a.q, a.q, n);
        ops.norm(layer, Norm::k, a.k, a.k, n);
    }
    ops.attention(layer, a.q, a.k, a.v, a.att, n);
}

void block_mlp(BlockOps& ops, const BlockDesc& desc, uint64_t layer, Rows in, Rows out,
               bool accumulate, const BlockActivations& a, uint64_t n) {
    ops.gated_products(layer, in, desc.activation, a.mlp, n);
    const Product down[] = {{Weight::down, out, accumulate, false}};
    ops.products(layer, a.mlp, down, n);
}

void run_block(BlockOps& ops, const BlockDesc& desc, uint64_t layer, const BlockActivations& a,
               uint64_t n) {
    ops.norm(layer, Norm::attn, a.x, a.h, n);
    block_attend(ops, desc, layer, a.h, a, n);
    if (desc.sandwich_norms) {
        // The products' outputs go through h (free once its consumers ran), then their norms
        // add them to the residual.
        const Product o[] = {{Weight::o, a.h, false, false}};
        ops.products(layer, a.att, o, n);
        ops.norm_add(layer, Norm::attn_post, a.h, a.x, n);
        ops.norm(layer, Norm::mlp, a.x, a.h, n);
        block_mlp(ops, desc, layer, a.h, a.h, false, a, n);
        ops.norm_add(layer, Norm::mlp_post, a.h, a.x, n);
        return;
    }
    const Product o[] = {{Weight::o, a.x, true, false}};
    ops.products(layer, a.att, o, n);
    ops.norm(layer, Norm::mlp, a.x, a.h, n);
    block_mlp(ops, desc, layer, a.h, a.x, true, a, n);
}

void run_model(ForwardOps& ops, const BlockDesc& desc, uint64_t layers, const int32_t* tokens,
               uint64_t n, const BlockActivations& a, uint64_t logits_from, Rows logits) {
    ops.embed(tokens, n, a.x);
    if (desc.embed_scale > 0.0f) ops.scale(a.x, n, a.x.ld, desc.embed_scale);
    for (uint64_t l = 0; l < layers; ++l) run_block(ops, desc, l, a, n);
    if (logits_from >= n) return;
    const uint64_t rows = n - logits_from;
    ops.norm(layers, Norm::final, {a.x.data + logits_from * a.x.ld, a.x.ld}, a.h, rows);
    const Product head[] = {{Weight::lm_head, logits, false, false}};
    ops.products(layers, a.h, head, rows);
    if (desc.final_softcap > 0.0f) ops.softcap(logits, rows, logits.ld, desc.final_softcap);
}

}  // namespace qforge
