// AWQ, activation-aware weight quantization (Lin et al., arXiv 2306.00978; AutoAWQ
// awq/quantize/quantizer.py): before rounding, the input channels of each group of linears that
// share an input are scaled by s = mean|x|^alpha, so the channels that carry large activations get
// finer steps; the inverse scale is folded into the op that produces the input (an RMSNorm
// weight, v_proj's rows, up_proj's rows), so the float model computes exactly the same function.
//
// The pieces here work on plain float32 matrices, so each is testable on its own; the pipeline
// (quant/layer_sequential.cpp) decides which linears form a group, what output is inspected, and
// where the scales are folded:
//   1. awq_search_scales: for alpha in {0, 1/grid, ..., (grid-1)/grid}: s = x_mean^alpha clamped
//      to >= kAwqMinScale, normalized by sqrt(max(s) * min(s)); every linear of the group is
//      quantized as Q(W diag s) diag(1/s) (RTN on the type table's grid, the same as RTN and GPTQ:
//      formats/qtype.hpp qtype_group_params) and a caller's callback measures the inspected
//      module's output error for those weights. The alpha with the least error wins (ties: the
//      smaller alpha, so alpha = 0, plain RTN, wins when scaling does not help).
//   2. awq_fold: the chosen scales folded into one decoder block's float weights.
//   3. awq_clip: per output row and group of the scaled weights, max|w| * (1 - i/20) for i < 10
//      (AutoAWQ's max_shrink 0.5): the clip whose quantized group has the least output error on
//      the calibration inputs. AutoAWQ measures that error on 512 sampled tokens; here it is the
//      exact error over every calibration token, d^T H_gg d with d the group's weight error and
//      H_gg the group's diagonal block of the (scaled) inputs' H = 2/N X^T X: cheaper than a
//      forward pass (group^2 flops per candidate) and without sampling noise. A group's
//      candidates are one dsymm (kAwqClipSteps rows) and a dot product each.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "formats/model_config.hpp"
#include "formats/qtype.hpp"

namespace qforge {

class ThreadPool;

inline constexpr int kAwqScaleGrid = 20;      // alphas 0, 1/20, ..., 19/20 (AutoAWQ n_grid)
inline constexpr float kAwqMinScale = 1e-4f;  // s clamped below (AutoAWQ)
inline constexpr int kAwqClipSteps = 10;      // clips max * (1 - i / kAwqClipGrid), i < steps
inline constexpr int kAwqClipGrid = 20;

// s = max(x_mean^alpha, kAwqMinScale), then s /= sqrt(max(s) * min(s)).
std::vector<float> awq_scales(const std::vector<double>& x_mean, double alpha);

// out = Q(W diag(s)) diag(1/s): the weights the model computes with when W's input channels are
// scaled by s before rounding (s null: plain RTN). w, out: [rows][k]. Throws qforge::Error when
// a group's scale overflows fp16.
void awq_fake_quantize(QType t, const float* w, uint64_t rows, uint64_t k, const float* s,
                       float* out, ThreadPool* pool = nullptr);

// One linear of a group sharing an input: float32 weights [rows][k] and the type it will be
// stored in (a float type: its candidate is W itself, unrounded).
struct AwqLinear {
    const float* w;
    uint64_t rows;
    QType qtype;
};

// The inspected module's output error for candidate weights: one matrix per linear of the group,
// in the order given, each Q(W diag s) diag(1/s) in the original coordinates.
using AwqEvaluate = std::function<double(const std::vector<std::vector<float>>& candidate)>;

struct AwqScaleSearch {
    int best = 0;                // index into the alpha grid
    double alpha = 0.0;          // best / grid
    std::vector<float> scales;   // [k], awq_scales(x_mean, alpha)
    std::vector<double> errors;  // the evaluated error for each alpha of the grid
    double error() const { return errors.at(static_cast<size_t>(best)); }
    double rtn_error() const { return errors.at(0); }  // alpha = 0: s = 1
};

AwqScaleSearch awq_search_scales(const std::vector<double>& x_mean,
                                 const std::vector<AwqLinear>& linears, uint64_t k,
                                 const AwqEvaluate& evaluate, int grid = kAwqScaleGrid,
                                 ThreadPool* pool = nullptr);

// trace((W - Q) H (W - Q)^T) for w, q [rows][k] and h [k][k] (float64, symmetric, both triangles
// filled): the summed squared output error of the linear on the inputs whose H this is, times
// 2/N. quant/hessian.hpp's quadratic_forms: rows in fixed batches spread over `pool`, the same
// bits for any thread count while BlasSingleThread is alive.
double awq_hessian_error(const float* w, const float* q, uint64_t rows, uint64_t k,
                         const std::vector<double>& h, ThreadPool* pool = nullptr);
// The same with float32 products (quadratic_forms_f32; hf: H as float32): the scale searches'
// ranking of their candidates, at twice the speed.
double awq_hessian_error_f32(const float* w, const float* q, uint64_t rows, uint64_t k,
                             const std::vector<float>& hf, ThreadPool* pool = nullptr);

// The H of inputs x diag(1/s): H[i][j] / (s_i s_j).
std::vector<double> awq_scale_hessian(const std::vector<double>& h, const std::vector<float>& s);

struct AwqClipStats {
    uint64_t groups = 0;   // (row, group) pairs searched
    uint64_t clipped = 0;  // of them, those where a clip below max|w| won
};

// Clipping search on w [rows][k] (in place: each group's weights clamped to [-c, c] with its
// chosen c), with h the H of the inputs w sees. The type's grid is then computed on the clamped
// weights by whatever quantizer follows (RTN or GPTQ).
AwqClipStats awq_clip(QType t, float* w, uint64_t rows, uint64_t k, const std::vector<double>& h,
                      ThreadPool* pool = nullptr);

// One decoder block's float32 weights, as the folding needs them (row-major [out][in]; the
// biases may be empty).
struct AwqBlock {
    std::vector<float> attn_norm, q, k, v, v_bias, o, mlp_norm, gate, up, down;
};

// The scales of one block; an empty vector means that group was not scaled.
struct AwqBlockScales {
    std::vector<float> qkv;      // [hidden]: attn_norm /= s, q/k/v columns *= s
    std::vector<float> vo;       // [q_dim]:  v rows (and bias) /= s, o columns *= s
    std::vector<float> gate_up;  // [hidden]: mlp_norm /= s, gate/up columns *= s
    std::vector<float> down;     // [intermediate]: up rows /= s, down columns *= s
};

// AutoAWQ scales v -> o only when v_proj and o_proj have the same shape: with grouped-query
// attention one v channel feeds several heads' outputs, so there is no per-channel fold.
inline bool awq_scales_v_to_o(const ModelConfig& c) { return c.num_kv_heads == c.num_heads; }

// Folds the scales into b; the block computes the same function afterwards (up to float
// rounding). Throws qforge::Error when a scale vector has the wrong size, or vo is given where
// awq_scales_v_to_o is false.
void awq_fold(const ModelConfig& c, AwqBlock& b, const AwqBlockScales& s);

}  // namespace qforge
