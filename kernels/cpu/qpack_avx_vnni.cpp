// The avx2 level's products on packed rows with AVX-VNNI (qpack_avx2_kernels.hpp compiled with
// the avxvnni target): each int8 dot product is VEX vpdpbusd on the bytes maddubs takes, into the
// same int32 sums, so every output has the avx2 packed row's bits, which are the scalar
// reference's (tests/kernels_qdot_test.cpp). Chosen for the avx2 level when cpu_uses_avx_vnni().
#define QF_AVX2 __attribute__((target("avx2,fma,f16c,avxvnni")))
#define QF_INT8_VNNI 1
#include "kernels/cpu/qpack_avx2_kernels.hpp"

namespace qforge::detail {

#if defined(__x86_64__)

const QPackedKernelRow& avx_vnni_packed_kernels() {
    static constexpr QPackedKernelRow row = packed_row(std::make_index_sequence<kQTypeCount>{});
    return row;
}

#else  // no x86: the table never selects this row

const QPackedKernelRow& avx_vnni_packed_kernels() {
    static constexpr QPackedKernelRow row{};
    return row;
}

#endif

}  // namespace qforge::detail
