// The calibration pass's operations (runtime/transformer.hpp's BlockOps): one decoder block at a
// time over the whole calibration batch, on the weights in a BlockView the layer-sequential
// quantizers (GPTQ, AWQ) swap as they go. A ProductHook sees the input of each group of products
// (and of each norm) before it runs, so the pipeline can collect statistics, quantize those
// linears and put their quantized weights in the view: the rest of the block then runs with them.
//
// The batch is `sequences` independent sequences of `seq_len` tokens each, every one starting at
// position 0 (causal attention within its sequence only). Float32 compute; the products are
// OpenBLAS sgemm on weights dequantized to float32 once per call (f32 views are used in place),
// which is what a calibration pass over tens of thousands of tokens needs; attention is two
// sgemms per block of queries and head (with bf16 products, two bf16_matmuls). Products run in
// fixed
// panels, so results do not depend on the thread count. Activations are dense: every Rows given
// to an operation has ld equal to its width. Tested against the CPU backend's logits
// (tests/quant_block_forward_test.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "formats/model_config.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "quant/calibration.hpp"
#include "runtime/model.hpp"
#include "runtime/rope.hpp"
#include "runtime/transformer.hpp"

namespace qforge {

class ThreadPool;

// The weights a block runs with: views, owned by the caller. A linear with no rows, or a null
// norm, is not set (an operation that needs it throws). Biases may be null or empty: none.
struct BlockView {
    std::array<Matrix, kBlockLinears + 1> linear;          // by Weight (lm_head last)
    std::array<const std::vector<float>*, kNorms> norm{};  // by Norm
    std::array<const std::vector<float>*, 3> qkv_bias{};   // q, k, v

    Matrix& operator[](Weight w) { return linear[static_cast<size_t>(w)]; }
    const Matrix& operator[](Weight w) const { return linear[static_cast<size_t>(w)]; }
};

// A view of one model layer's stored weights (and the model's final norm and output head).
BlockView layer_view(const Model& model, uint64_t layer);
// A float32 matrix view [rows][cols] over `w`.
Matrix f32_matrix(std::string name, const std::vector<float>& w, uint64_t rows, uint64_t cols);

class ProductHook {
  public:
    virtual ~ProductHook() = default;
    // Before the products of one shared input: `first` is q (q, k, v), o, gate (gate, up) or down.
    virtual void before_products(Weight first, Rows in, uint64_t n) = 0;
    // Before a norm runs on `in` (the residual stream).
    virtual void before_norm(Norm which, Rows in, uint64_t n) = 0;
};

class BlockForward final : public BlockOps {
  public:
    // Panels of the products (see linear_f32).
    static constexpr uint64_t kPanelRows = 256, kPanelTokens = 512;
    // Tokens per step of the gated products (bounds the gate and up outputs to this many rows).
    static constexpr uint64_t kGateChunk = 4096;
    // Query positions per step of attention (see attention()): its two products are sgemms of
    // this many rows; the keys past a block's diagonal, computed and given weight 0, are at most
    // this many per row.
    static constexpr uint64_t kAttentionBlock = 64;

    BlockForward(const ModelConfig& config, uint64_t sequences, uint64_t seq_len, ThreadPool& pool,
                 CalibProducts products = CalibProducts::f32);

    uint64_t tokens() const { return sequences_ * seq_len_; }
    const ModelConfig& config() const { return c_; }
    const BlockDesc& desc() const { return desc_; }

    BlockView view;               // the weights the operations use
    ProductHook* hook = nullptr;  // null: none

    // Dense activations for the whole batch; att shares q's rows (attention reads each query
    // head before it writes that head's output) and mlp shares the q/k/v buffer.
    struct Buffers {
        std::vector<float> h, qkv_mlp;
    };
    BlockActivations activations(float* x, Buffers& b) const;

    // BlockOps (runtime/transformer.hpp); the view is the block, the layer index only chooses
    // the attention window.
    void norm(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) override;
    void norm_add(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) override;
    void products(uint64_t layer, Rows in, std::span<const Product> products, uint64_t n) override;
    // n must be the whole batch: attention follows the sequences.
    void attention(uint64_t layer, Rows q, Rows k, Rows v, Rows out, uint64_t n) override;
    void gated_products(uint64_t layer, Rows in, Activation act, Rows out, uint64_t n) override;

    // y[t][r] = x[t] . W[r] for `n` tokens; W in any qtype.
    void linear(const Matrix& w, const float* x, uint64_t n, float* y) const;

  private:
    // A matrix ready for products: f32 rows (the view's own when f32, else dequantized once) or,
    // with bf16 products, packed bf16 rows.
    struct Prepared {
        uint64_t rows = 0, cols = 0;
        const float* f32 = nullptr;
        std::vector<float> owned;
        Bf16PackedRows bf16;
    };
    Prepared prepare(const Matrix& w) const;
    // attention()'s products with bf16 products (q, k, v, out: the batch's dense rows, RoPE
    // applied; out may be q).
    void attention_bf16(uint64_t layer, const float* q, const float* k, const float* v, float* out);
    // ys[i][t][r] = x[t] . row r of ws[i] for n tokens; every matrix has x's width.
    void apply(std::span<const Prepared> ws, const float* x, uint64_t n,
               std::span<float* const> ys) const;

    const Matrix& weight(Weight w) const;
    void rms_norm(const float* x, const std::vector<float>& weight, float* out, uint64_t n,
                  NormShape shape, bool accumulate = false) const;
    // norm / norm_add: out (=, or += when accumulate) norm(in) * the view's weight.
    void apply_norm(Norm which, Rows in, Rows out, uint64_t n, bool accumulate);

    // Scratch kept across calls (the calibration batch's sizes: allocating and zeroing them per
    // call cost as much as the products they hold): gated_products' gate and up outputs, and a
    // residual add's product before it is added.
    std::vector<float> gate_, up_, sum_;

    const ModelConfig& c_;
    BlockDesc desc_;
    uint64_t sequences_, seq_len_;
    ThreadPool& pool_;
    CalibProducts products_;
    RopeTable rope_, rope_local_;  // rope_local_: the sliding layers' (ModelConfig::local_rope)
};

// The float model's embeddings of `tokens` as the first layer's input, [n][hidden] (Gemma:
// scaled, as runtime/transformer.hpp's run_model does).
std::vector<float> embed_tokens(const Model& model, const std::vector<int32_t>& tokens);

// Runs layer `l` of `model` (its stored weights, no hook) on x in place: x' = layer(x).
void run_layer(BlockForward& f, const Model& model, uint64_t layer, std::vector<float>& x);

}  // namespace qforge
