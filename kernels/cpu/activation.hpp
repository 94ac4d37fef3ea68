// Elementwise functions of the runtime's hot loops: the gated MLP's SiLU, the attention
// softmax's exponentials and RMSNorm. Levels: scalar (std::exp, the runtime's former loops, bit for
// bit) and avx2 (an 8-lane exp: Cody-Waite reduction by ln 2 and a degree-5 polynomial on [-ln2/2,
// ln2/2], within 2 ulp of exp; avx512 runs the same code, so the two give the same bits).
//
// Each element is computed by the same lane operations wherever it lies in the array (a last
// partial vector goes through the same 8-lane code), so a value never depends on n or on how a
// caller splits its rows: prefill equals decode and any thread count gives the same bits.
//
// The avx2 exp flushes results below FLT_MIN to 0 (arguments below -87.34) and returns +inf above
// 88.376 (where exp is above 2.4e38); NaN stays NaN. Neither edge moves a SiLU (x / (1 + exp(-x))
// is within 2^-126 |x| of 0 or of x there) or a softmax term (exp(s - max) <= 1).
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.hpp"

namespace qforge {

// out[i] = gate[i] / (1 + exp(-gate[i])) * up[i] for i < n, in that order of roundings. out may
// be gate or up.
void silu_mul(Isa isa, const float* gate, const float* up, float* out, uint64_t n);

// s[i] = exp(s[i] - shift) for i < n.
void exp_shifted(Isa isa, float* s, uint64_t n, float shift);

// The softmax of s[0..n) in place (n >= 1): m = the largest s[i]; e[i] = exp_shifted's exp(s[i] -
// m); their sum in eight interleaved partial sums (i mod 8, each in order) added as
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)); then s[i] = e[i] * (1 / sum). The same
// order at every level (one running sum was a chain of dependent adds: 5% of a calibration
// pass). Each row's value depends only on the row: any thread count, prefill or decode.
void softmax(Isa isa, float* s, uint64_t n);

// RMSNorm of one row of d floats (the runtime's and the calibration forward's): scale =
// fl(1 / sqrt(sum x[i]^2 / d + eps)) with the squares (exact in double) summed in double, in
// eight interleaved partial sums (i mod 8, each in order) added as ((p0 + p1) + (p2 + p3)) +
// ((p4 + p5) + (p6 + p7)); then y[i] = w[i] * (x[i] * scale), or y[i] += that when accumulate.
// Plain code, the same at every level. One running double sum was a chain of d dependent adds:
// 2% of a 16-stream serving step at d = 576.
void rms_norm_row(const float* x, const float* w, uint64_t d, double eps, float* y,
                  bool accumulate);

}  // namespace qforge
