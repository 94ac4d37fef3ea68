// GEMV instantiations for 4-bit rows (q4_g32/64/128, q4s_g32/64/128). gemv.cuh has the kernel
// and its supported configurations.
#include "kernels/cuda/gemv.cuh"

namespace qforge::cuda {

void gemv_q4_launch(const GemvParams& p, uint32_t threads, uint32_t token_tile, uint64_t blocks,
                    uint32_t rows_per_block, cudaStream_t stream) {
    gemv_detail::launch_kind<WeightKind::q4>(p, threads, token_tile, blocks, rows_per_block,
                                             stream);
}

}  // namespace qforge::cuda
