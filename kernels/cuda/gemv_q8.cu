// GEMV instantiations for 8-bit rows (q8, q8_g32, q8_g128). gemv.cuh has the kernel and its
// supported configurations.
#include "kernels/cuda/gemv.cuh"

namespace qforge::cuda {

void gemv_q8_launch(const GemvParams& p, uint32_t threads, uint32_t token_tile, uint64_t blocks,
                    uint32_t rows_per_block, cudaStream_t stream) {
    gemv_detail::launch_kind<WeightKind::q8>(p, threads, token_tile, blocks, rows_per_block,
                                             stream);
}

}  // namespace qforge::cuda
