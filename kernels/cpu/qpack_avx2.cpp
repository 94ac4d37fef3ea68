// The avx2 level's products on packed rows (qpack_avx2_kernels.hpp has them and their design),
// with vpmaddubsw and vpmaddwd.
#include "kernels/cpu/qpack_avx2_kernels.hpp"

namespace qforge::detail {

#if defined(__x86_64__)

const QPackedKernelRow& avx2_packed_kernels() {
    static constexpr QPackedKernelRow row = packed_row(std::make_index_sequence<kQTypeCount>{});
    return row;
}

#else  // no x86: the table never selects this level

const QPackedKernelRow& avx2_packed_kernels() {
    static constexpr QPackedKernelRow row{};
    return row;
}

#endif

}  // namespace qforge::detail
