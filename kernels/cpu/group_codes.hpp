// The codes of a run of weights on one group's grid, vectorised: each code equals
// qtype_quantize_value(t, p, w[j]) (formats/qtype.hpp), bit for bit, at every level. The
// calibrated methods' grid searches (quant/rtn_importance.cpp) quantize every weight of a group
// once per candidate grid, dozens of candidates per group; one call per weight, with its type
// dispatch and a scalar division, was 8-12% of a GPTQ or AWQ run (`perf record`, SmolLM2-135M).
//
// Why the bits are the same: the vector versions run the scalar expression's IEEE operations
// lane by lane (a correctly rounded division, round to nearest even, the zero added, the clamp,
// a truncation of an integral value), so only the number of weights per instruction changes.
// Level types (a table lookup by nearest level) take the scalar function per weight.
#pragma once

#include <cstdint>

#include "formats/qtype.hpp"
#include "kernels/cpu/isa.hpp"

namespace qforge {

// codes[j] = qtype_quantize_value(t, p, w[j]) for j < n (w finite, as every caller's weights are
// checked to be), at the process's level.
void group_codes(QType t, const QGroupParams& p, const float* w, uint64_t n, int32_t* codes);
// The same at a given level (at most cpu_isa(): tests compare every level the CPU has).
void group_codes_isa(Isa isa, QType t, const QGroupParams& p, const float* w, uint64_t n,
                     int32_t* codes);

// Eight interleaved float64 partial sums: add(j, v) adds v to partial sum j mod 8, total()
// returns ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)). A fixed order, so a sum's bits do
// not depend on how it is vectorised, and eight independent chains of adds instead of one.
struct InterleavedSum {
    double s[8] = {};
    void add(uint64_t j, double v) { s[j % 8] += v; }
    double total() const {
        return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
};

// A grid's weighted squared error on n finite weights: the InterleavedSum over j < n of
// (a_j d_j) d_j, d_j = double(w_j) - double(qtype_dequantize_value(t, p, c_j)) with
// c_j = qtype_quantize_value(t, p, w_j) (a null: every a_j = 1). The same bits at every level:
// the vector versions compute each term with the scalar expression's operations lane by lane.
// (The importance search evaluates dozens of grids per group: one scalar chain per grid was its
// whole cost.)
double group_error(QType t, const QGroupParams& p, const float* w, const double* a, uint64_t n);
double group_error_isa(Isa isa, QType t, const QGroupParams& p, const float* w, const double* a,
                       uint64_t n);

// The moments of a weighted least-squares line through the points (c_j, x_j), c_j = codes[j] -
// offset (as a double) and x_j = double(w[j]): InterleavedSums over j < n of a_j, a_j c_j,
// (a_j c_j) c_j, a_j x_j and (a_j x_j) c_j (a null: every a_j = 1). The same bits at every level.
struct CodeMoments {
    double s, sc, scc, sw, swc;
};
CodeMoments code_moments(const int32_t* codes, int32_t offset, const float* w, const double* a,
                         uint64_t n);
CodeMoments code_moments_isa(Isa isa, const int32_t* codes, int32_t offset, const float* w,
                             const double* a, uint64_t n);

}  // namespace qforge
