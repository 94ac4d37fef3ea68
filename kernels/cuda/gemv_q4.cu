// GEMV instantiations for 4-bit rows (q4_g32/64/128, q4s_g32/64/128). gemv.cuh has the kernel
// and its supported configurations.
#include "kernels/cuda/gemv.cuh"

namespace qforge::cuda {

void gemv_q4_launch(const GemvParams& p, uint32_t threads, uint32_t token_tile, uint64_t blocks,
                    uint32_t rows_per_block, cudaStream_t stream) {
    gemv_detail::launch_kind<WeightKind::q4>(p, threads, token_tile, blocks, rows_per_block,
                                             stream);
}

bool gemv_overlap_compiled() {
    // pdl.cuh's instructions exist only in code compiled for sm_90 or newer: a build whose GEMV
    // is PTX of an older architecture, JIT-compiled for this GPU, must not overlap its launches.
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, gemv_detail::gemv_kernel<WeightKind::q4, 1, true, 4>) !=
        cudaSuccess) {
        (void)cudaGetLastError();  // not sticky; the launches will report a real fault
        return false;
    }
    return attr.ptxVersion >= 90;
}

}  // namespace qforge::cuda
