// GEMV instantiations for float rows (f32, f16, bf16; rows zero-padded to whole chunks at load).
// gemv.cuh has the kernel and its supported configurations.
#include "kernels/cuda/gemv.cuh"

namespace qforge::cuda {

void gemv_float_launch(const GemvParams& p, uint32_t threads, uint32_t token_tile, uint64_t blocks,
                       cudaStream_t stream) {
    switch (p.w.kind) {
        case WeightKind::f32:
            gemv_detail::launch_kind<WeightKind::f32>(p, threads, token_tile, blocks, 1, stream);
            break;
        case WeightKind::f16:
            gemv_detail::launch_kind<WeightKind::f16>(p, threads, token_tile, blocks, 1, stream);
            break;
        case WeightKind::bf16:
            gemv_detail::launch_kind<WeightKind::bf16>(p, threads, token_tile, blocks, 1, stream);
            break;
        default:
            throw_cuda_error(cudaErrorInvalidValue, "gemv_float_launch: not a float kind", __FILE__,
                             __LINE__);
    }
}

}  // namespace qforge::cuda
