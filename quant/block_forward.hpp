// One decoder layer run step by step over the calibration batch, so the layer-sequential
// quantizers (GPTQ, AWQ) can capture the input of each linear and swap in its quantized weights
// before the next step (runtime/backend.hpp has the equations):
//
//   h  = rms_norm(x, attn_norm)            -> input of q, k, v
//   q, k, v = linear(h), rope(q, k)
//   a  = attention(q, k, v)                -> input of o
//   x1 = x + linear_o(a)
//   h2 = rms_norm(x1, mlp_norm)            -> input of gate, up
//   m  = silu(linear_gate(h2)) * linear_up(h2)   -> input of down
//   x' = x1 + linear_down(m)
//
// The batch is `sequences` independent sequences of `seq_len` tokens each, every one starting at
// position 0 (causal attention within its sequence only). Float32 compute; the linears are
// OpenBLAS sgemm on weights dequantized to float32 once per call (exact for every qtype), which
// is what a calibration pass over tens of thousands of tokens needs. Products run in fixed
// panels, so results do not depend on the thread count. Tested against the CPU backend's logits
// (tests/quant_block_forward_test.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "formats/model_config.hpp"
#include "runtime/model.hpp"
#include "runtime/rope.hpp"

namespace qforge {

class ThreadPool;

class BlockForward {
  public:
    // Panels of the linears' products (see linear_f32).
    static constexpr uint64_t kPanelRows = 256, kPanelTokens = 512;

    BlockForward(const ModelConfig& config, uint64_t sequences, uint64_t seq_len,
                 ThreadPool& pool);

    uint64_t tokens() const { return sequences_ * seq_len_; }
    const ModelConfig& config() const { return c_; }

    // out[t] = rms_norm(x[t]) * weight, [tokens][hidden].
    void rms_norm(const float* x, const std::vector<float>& weight, float* out) const;

    // y[t][r] = x[t] . W[r] (+ bias[r]) for `n` tokens; W in any qtype.
    void linear(const Matrix& w, const float* x, uint64_t n, float* y,
                const std::vector<float>* bias = nullptr) const;
    // The same with float32 weights [rows][cols] already in memory.
    void linear_f32(const float* w, uint64_t rows, uint64_t cols, const float* x, uint64_t n,
                    float* y) const;

    // q [tokens][q_dim], k and v [tokens][kv_dim]: rotates q and k in place (RoPE by position in
    // the sequence) and writes the attention output [tokens][q_dim].
    void attention(float* q, float* k, const float* v, float* out) const;

    // out[i] = silu(gate[i]) * up[i] over n elements.
    void swiglu(const float* gate, const float* up, float* out, uint64_t n) const;

  private:
    const ModelConfig& c_;
    uint64_t sequences_, seq_len_;
    ThreadPool& pool_;
    RopeTable rope_;
};

// The float model's embeddings of `tokens` as the first layer's input, [n][hidden].
std::vector<float> embed_tokens(const Model& model, const std::vector<int32_t>& tokens);

// Runs layer `l` of `model` (its stored weights) on x in place: x' = layer(x). For tests and for
// feeding the next layer when a layer is kept float.
void run_layer(const BlockForward& f, const LayerWeights& w, std::vector<float>& x);

}  // namespace qforge
