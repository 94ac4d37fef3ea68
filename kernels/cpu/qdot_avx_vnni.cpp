// The avx2 level's quantized products with AVX-VNNI (qdot_avx2_kernels.hpp compiled with the
// avxvnni target): the int8 dot products are VEX vpdpbusd, one instruction where AVX2 takes
// vpmaddubsw and vpmaddwd, on the same bytes into the same int32 sums, so every output has the
// avx2 row's bits (tests/kernels_qdot_test.cpp compares them with memcmp). qdot.cpp's table takes
// this row for the avx2 level when cpu_uses_avx_vnni() (isa.hpp).
#define QF_AVX2 __attribute__((target("avx2,fma,f16c,avxvnni")))
#define QF_INT8_VNNI 1
#include "kernels/cpu/qdot_avx2_kernels.hpp"

namespace qforge::detail {

#if defined(__x86_64__)

const QKernelRow& avx_vnni_kernels() {
    static constexpr QKernelRow row = avx2_row(std::make_index_sequence<kQTypeCount>{});
    return row;
}

#else  // no x86: the table never selects this row

const QKernelRow& avx_vnni_kernels() {
    static constexpr QKernelRow row{};
    return row;
}

#endif

}  // namespace qforge::detail
