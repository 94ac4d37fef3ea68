// The per-level kernel rows behind kernels/cpu/qdot.hpp's dispatch (internal to kernels/cpu:
// callers use qmatmul and dequantize_rows, which pick a level with cpu_isa()).
#pragma once

#include <array>
#include <cstdint>

#include "kernels/cpu/qdot.hpp"

namespace qforge::detail {

// One (qtype, ISA) cell of kernels/cpu/qdot.cpp's table: the qmatmul and dequantize_rows of one
// level for one type, with their public contracts (the QType argument is the cell's own type).
// Null: this level has no kernel of its own for the type, the level below serves it.
using QMatmulKernel = void (*)(QType t, const uint8_t* w, uint64_t stride, uint64_t r0, uint64_t r1,
                               const QActivations& a, uint64_t t0, uint64_t t1, float* out,
                               uint64_t ldo);
using DequantizeKernel = void (*)(QType t, const uint8_t* w, uint64_t stride, uint64_t n,
                                  uint64_t k, float* out);
struct QKernels {
    QMatmulKernel qmatmul = nullptr;
    DequantizeKernel dequantize = nullptr;
};
using QKernelRow = std::array<QKernels, kQTypeCount>;  // indexed by QType, as kQTypes

// The AVX2/FMA/F16C kernels (qdot_avx2.cpp): every quantized type, k >= 1.
const QKernelRow& avx2_kernels();
// The same kernels with AVX-VNNI's vpdpbusd for the int8 products (qdot_avx_vnni.cpp): the avx2
// row's bits; call only where the CPU has AVX-VNNI (isa.hpp's cpu_has_avx_vnni).
const QKernelRow& avx_vnni_kernels();

// The AVX-512 F/BW/VL + VNNI kernels (qdot_avx512.cpp): every quantized type's int8-activation
// product, bit-identical to qmatmul_scalar's; f32 mode and dequantization are AVX2's.
const QKernelRow& avx512_kernels();

// The products on packed rows (kernels/cpu/qpack.hpp), qmatmul_packed's contract, per level;
// null for types a level leaves to its row kernels.
using QPackedKernel = void (*)(const QPackedRows& m, uint64_t r0, uint64_t r1,
                               const QActivations& a, uint64_t t0, uint64_t t1, float* out,
                               uint64_t ldo);
using QPackedKernelRow = std::array<QPackedKernel, kQTypeCount>;
const QPackedKernelRow& avx512_packed_kernels();  // every type with a packed layout
// The same types' products of 16 or more tokens on AMX tiles (qdot_amx.cpp), the same bits; call
// only with activations that hold their tile operands (QActivations::has_tiles()) and t0 a
// multiple of 16.
const QPackedKernelRow& amx_packed_kernels();
// AVX2 (qpack_avx2.cpp): q8*, q4_g*, q4s_g*, q4k_g32, with one row per lane, qmatmul_scalar's bits.
const QPackedKernelRow& avx2_packed_kernels();
// The same with AVX-VNNI's vpdpbusd (qpack_avx_vnni.cpp): the same bits; call only where the
// CPU has AVX-VNNI.
const QPackedKernelRow& avx_vnni_packed_kernels();

// Int8 activation blocks for QActivations::prepare: `blocks` whole blocks of 32 floats from x,
// each to codes q (32 per block), scale d and code sum s; the same bits as the scalar
// quantize_activation_block in qdot.cpp (the same division and round-to-nearest-even).
void quantize_activation_blocks_avx2(const float* x, uint64_t blocks, int8_t* q, float* d,
                                     int32_t* s);

}  // namespace qforge::detail
