// The float64 side of the backend-equivalence sweep (tests/backend_ops_test.cpp): each operation
// of runtime/transformer.hpp written out plainly from the dequantized weights, and the bound
// each backend's result must meet, derived from how that backend computes (its Numerics). The
// sweep itself lives in the test; this header only knows weights, activations and arithmetic, so
// it serves the CPU and the CUDA backend alike.
//
// u = 2^-24, float's unit roundoff. A float sum of terms t_i with at most r roundings on any path
// from a term to the result is within r * u * sum |t_i| (to first order; every bound has a factor
// 1.01 for the second-order terms). Per operation:
//   products  y = W x (+ bias) (+ prior when accumulating): r roundings times the magnitude
//             M = sum_j m_j |a_j| + |bias| + |prior|, where a_j is the activation the kernel
//             multiplies and m_j the weight's magnitude in the kernel's sums: |w_j| for float rows
//             and float activations; for int8 activations the codes and the zero point are summed
//             apart (w = s (c - z), kernels/cpu/qdot.hpp), so m_j = |s| (|c_j| + |z|). r: the
//             CPU's kernels, per kernels/cpu/qdot.hpp and float_dot.hpp: quantized rows, int8 or
//             SIMD: blocks + 8; quantized rows, f32, scalar: k + 1; float rows (one fixed order
//             on every level: one fma per 32-block and lane, up to 3 more 8-blocks, 3 lane adds, 7
//             tail adds): blocks + 16. CUDA (order not fixed by this test): k + 1. Plus 2: the
//             bias add and the accumulate.
//             int8 activations: a_j = d_b q_j with d_b = fl(amax_b / 127), |x_j - a_j| <=
//             d_b (1/2 + 2^-16), which moves the product by sum_j |w_j| d_b (1/2 + 2^-16).
//             fp16 products (CUDA's tensor-core and cuBLAS paths): activations and weights each
//             rounded once to fp16, relative 2^-11 each, plus half an fp16 subnormal step
//             (2^-25) absolute per element: 2^-10 sum |w_j x_j| + 2^-25 (sum |w_j| + sum |x_j|).
//   norm      y_i = w_i x_i / sqrt(mean(x^2) + eps), the sum of squares in float64 on both
//             backends: the scale's rounding and two products, 3 roundings relative to |y_i|.
//   gated     y = silu(g) * up with g, up products bounded as above (Bg, Bu): |silu'| <= 1.1
//             (its maximum, 1.0998 at 2.40), so |dy| <= 1.1 Bg |up| + |silu(g)| Bu + 1.1 Bg Bu,
//             plus exp (<= 2 ulp), the add, the divide and the product: 5 u |y|.
//   geglu     y = gelu_tanh(g) * up, as gated with |gelu_tanh'| <= 1.13 (its maximum, 1.129
//             at 1.5), and its arithmetic: the cube, the sums and products, tanh (2 ulp), 8 u |y|;
//             and 1 + tanh cancels for negative g: tanh's 2 ulp of 1 and the argument's 4 u
//             (through sech^2 z |z| <= 0.45) reach y as 3 u |g up|.
//   post-norm out += norm(x) * w: the norm's bound plus the add, u |out|.
//   scale     x * s, one rounding: u |x s|.
//   softcap   tanh(x / cap) * cap: the divide passes through the tanh's slope (<= 0.45 u cap
//             since |z| sech^2 z <= 0.45), tanh's 2 ulp and the product: 4 u cap.
//   rope      each rotated pair element a c - b s: two products, one add, and the float table's
//             cos and sin rounded once each: 4 u (|a| + |b|).
//   attention the score of key j: E = (hd + 16) u scale |q| max_j |k_j| (the dot product hd + 1,
//             the scale 1, RoPE on q and on k 4 sqrt(2) each relative to the vector's norm, the
//             max subtraction 2), plus 2^-11 scale |q| |k| with fp16 keys. Softmax moves each
//             weight p_j by at most 2 E p_j (first order), its own arithmetic by (len + 4) u p_j
//             (exp, the sum of len terms, the reciprocal, the product); the weighted sum of the
//             values adds (len + 1) u; an online softmax (CUDA) rescales the running sum once per
//             key (an exp and a product: 3 u more per key); fp16 values 2^-11. All relative to
//             sum_j p_j |v_j| per output element.
//   embed     exact: quantized rows dequantize exactly in float32, float rows widen exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/model_config.hpp"
#include "formats/qtype.hpp"

namespace qforge::test {

inline constexpr double kUnitRoundoff = 0x1p-24;

// How a backend computes, as far as the bounds care.
struct Numerics {
    bool cpu_kernels = true;        // the CPU's summation orders (kernels/cpu); false: any order
    bool scalar = false;            // the CPU's scalar level
    bool int8_activations = false;  // quantized products take int8 activation blocks
    bool fp16_products = false;     // products may round activations and weights to fp16
    bool fp16_kv = false;           // keys and values stored in fp16
    bool online_softmax = false;    // attention rescales a running sum per key
};

// A stored matrix, dequantized, with the per-weight magnitude of the int8 path's sums.
struct RefMatrix {
    QType qtype = QType::f32;
    uint64_t rows = 0, cols = 0;
    std::vector<double> w;          // [rows][cols]
    std::vector<double> magnitude;  // |s| (|c| + |z|) for quantized types, else |w|
};
RefMatrix ref_matrix(QType qtype, const uint8_t* data, uint64_t rows, uint64_t cols);

// One output of a product and its bound.
struct RefValue {
    double value = 0.0, bound = 0.0;
};

// Row r of W times x ([cols] floats), plus bias and prior (0 when absent): the value and the
// sums its bound is made of, once per input; the bound of a backend by at().
struct ProductRef {
    QType qtype = QType::f32;
    uint64_t k = 0;
    double value = 0.0;
    double act = 0.0;             // int8 activations' error: sum_j |w_j| d_b (1/2 + 2^-16)
    double magnitude_int8 = 0.0;  // sum_j m_j (|x_j| + err_j) + |bias| + |prior|
    double magnitude = 0.0;       // sum_j |w_j x_j| + |bias| + |prior|
    double sum_w = 0.0, sum_x = 0.0, sum_wx = 0.0;
    RefValue at(const Numerics& num) const;
};
ProductRef ref_product(const RefMatrix& m, uint64_t r, const float* x, double bias, double prior);

// RMSNorm of one token's row (`d` wide) and each element's bound.
void ref_norm(const float* x, const std::vector<float>& weight, double eps, uint64_t d,
              std::vector<RefValue>& out);

// silu(g) * up from the two products' references.
RefValue ref_gated(const RefValue& g, const RefValue& up);
// gelu_tanh(g) * up (GeGLU), likewise.
RefValue ref_gated_gelu(const RefValue& g, const RefValue& up);

// A head vector rotated at `pos` (rotate-half layout) in float64, and each element's bound.
void ref_rope(const float* x, uint64_t head_dim, const std::vector<double>& inv_freq, uint64_t pos,
              std::vector<double>& rotated, std::vector<double>& bound);

// The attention of one query head over keys [0, len) (already rotated) and values, each
// head_dim wide: the output and each element's bound.
void ref_attention(const std::vector<double>& q, const std::vector<std::vector<double>>& keys,
                   const std::vector<std::vector<double>>& values, uint64_t head_dim,
                   const Numerics& num, std::vector<RefValue>& out);

}  // namespace qforge::test
