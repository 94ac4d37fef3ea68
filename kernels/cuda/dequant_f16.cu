// Dequantize-to-fp16 for the cuBLAS path: rows of a quantized matrix written out as fp16 weights
// (scale * (code - zero), exact in fp32, then rounded to nearest fp16), chunks * 32 halves per row.
//
// Supported configurations: q4 and q8 kinds (gpu_format.hpp), any k and rows below 2^31. One
// thread per 32-weight chunk; a warp writes 32 consecutive 64-byte pieces of one output row.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/dequant.hpp"
#include "kernels/cuda/launchers.hpp"

namespace qforge::cuda {

namespace {

__global__ void dequantize_f16_kernel(RowsParams w, uint32_t r0, uint32_t n, uint16_t* out) {
    const uint64_t total = static_cast<uint64_t>(n) * w.chunks;
    const uint32_t bits = w.kind == WeightKind::q4 ? 4 : 8;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t r = i / w.chunks, c = i % w.chunks;
        float v[32];
        dequant_quant_chunk(w.w + (r0 + r) * w.row_bytes, bits, c, w.chunks_per_group,
                            w.scales_offset, w.zeros_offset, w.has_zeros != 0, w.zero, v,
                            w.mins_offset);
        uint32_t packed[16];
        for (int k = 0; k < 16; ++k)
            packed[k] =
                static_cast<uint32_t>(__half_as_ushort(__float2half_rn(v[2 * k]))) |
                (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(v[2 * k + 1]))) << 16);
        uint4* dst =
            reinterpret_cast<uint4*>(out + r * (static_cast<uint64_t>(w.chunks) * 32) + c * 32);
        for (int k = 0; k < 4; ++k)
            dst[k] =
                make_uint4(packed[4 * k], packed[4 * k + 1], packed[4 * k + 2], packed[4 * k + 3]);
    }
}

}  // namespace

void dequantize_f16_launch(const RowsParams& w, uint32_t r0, uint32_t n, uint16_t* out,
                           cudaStream_t stream) {
    if (w.kind != WeightKind::q4 && w.kind != WeightKind::q8)
        throw_cuda_error(cudaErrorInvalidValue, "dequantize_f16_launch: not a quantized kind",
                         __FILE__, __LINE__);
    const uint64_t total = static_cast<uint64_t>(n) * w.chunks;
    const unsigned blocks =
        static_cast<unsigned>(std::clamp<uint64_t>((total + 255) / 256, 1, 65535));
    dequantize_f16_kernel<<<blocks, 256, 0, stream>>>(w, r0, n, out);
    QF_CUDA_CHECK_LAUNCH();
}

}  // namespace qforge::cuda
