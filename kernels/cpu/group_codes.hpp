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

}  // namespace qforge
