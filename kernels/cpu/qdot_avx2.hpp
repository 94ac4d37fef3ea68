// The AVX2/FMA/F16C versions behind kernels/cpu/qdot.hpp's dispatch (internal to kernels/cpu:
// callers use qmatmul and dequantize_rows, which pick these when cpu_has_avx2()).
#pragma once

#include <cstdint>

#include "kernels/cpu/qdot.hpp"

namespace qforge::detail {

// Whether t has an AVX2 kernel (every quantized type).
bool qdot_avx2_supports(QType t);

// Same contract as qmatmul; t must be a quantized type and the CPU must have AVX2/FMA/F16C.
void qmatmul_avx2(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                  const QActivations& a, uint64_t t0, uint64_t t1, float* out, uint64_t ldo);

// Int8 activation blocks for QActivations::prepare: `blocks` whole blocks of 32 floats from x,
// each to codes q (32 per block), scale d and code sum s; the same bits as the scalar
// quantize_activation_block in qdot.cpp (the same division and round-to-nearest-even).
void quantize_activation_blocks_avx2(const float* x, uint64_t blocks, int8_t* q, float* d,
                                     int32_t* s);

// Same contract as dequantize_rows (bit-identical to dequantize_row_ref).
void dequantize_rows_avx2(QType t, const uint8_t* w, uint64_t stride, uint64_t n, uint64_t k,
                          float* out);

}  // namespace qforge::detail
