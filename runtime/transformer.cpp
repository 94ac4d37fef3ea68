#include "runtime/transformer.hpp"

namespace qforge {

BlockDesc block_desc(const ModelConfig& config) {
    BlockDesc d;
    d.qkv_bias = config.attention_bias;
    d.qk_norm = architecture_has_qk_norm(config.arch);
    d.activation = Activation::silu;  // llama, mistral, qwen2, qwen3: SwiGLU
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
    const Product o[] = {{Weight::o, a.x, true, false}};
    ops.products(layer, a.att, o, n);
    ops.norm(layer, Norm::mlp, a.x, a.h, n);
    block_mlp(ops, desc, layer, a.h, a.x, true, a, n);
}

void run_model(ForwardOps& ops, const BlockDesc& desc, uint64_t layers, const int32_t* tokens,
               uint64_t n, const BlockActivations& a, uint64_t logits_from, Rows logits) {
    ops.embed(tokens, n, a.x);
    for (uint64_t l = 0; l < layers; ++l) run_block(ops, desc, l, a, n);
    if (logits_from >= n) return;
    const uint64_t rows = n - logits_from;
    ops.norm(layers, Norm::final, {a.x.data + logits_from * a.x.ld, a.x.ld}, a.h, rows);
    const Product head[] = {{Weight::lm_head, logits, false, false}};
    ops.products(layers, a.h, head, rows);
}

}  // namespace qforge
