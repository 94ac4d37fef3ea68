#include "kernels/cuda/gpu_format.hpp"

#include <cstring>

namespace qforge::cuda {

uint64_t GpuMatrixFormat::chunk_bytes() const {
    switch (kind) {
        case WeightKind::f32:
            return kChunkWeights * 4;
        case WeightKind::f16:
        case WeightKind::bf16:
            return kChunkWeights * 2;
        case WeightKind::q8:
            return kChunkWeights;
        case WeightKind::q4:
            return kChunkWeights / 2;
    }
    return 0;
}

GpuMatrixFormat gpu_matrix_format(QType qtype, uint64_t k) {
    const CudaQTypeRow& row = cuda_qtype_row(qtype);
    const QTypeTraits& tr = qtype_traits(qtype);
    if (!row.supported)
        throw UnsupportedOnCuda("qtype " + std::string(tr.name) + " has no CUDA kernels");
    if (k == 0 || k > kMaxGpuDim)
        throw UnsupportedOnCuda("rows of " + std::to_string(k) + " weights (1 .. " +
                                std::to_string(kMaxGpuDim) + " supported)");
    GpuMatrixFormat f;
    f.qtype = qtype;
    f.kind = row.kind;
    f.k = k;
    f.kpad = round_up(k, kChunkWeights);
    f.chunks = f.kpad / kChunkWeights;
    f.file_row_bytes = *qtype_row_bytes(qtype, k);
    if (tr.is_float) {
        f.row_bytes = round_up(f.kpad * (tr.bits / 8), kGpuRowAlign);
        f.chunks_per_group = f.chunks;
        return f;
    }
    const QRowLayout l = *qtype_row_layout(qtype, k);
    f.row_bytes = round_up(l.row_bytes, kGpuRowAlign);
    f.scales_offset = l.scales_offset;
    f.zeros_offset = l.zeros_offset;
    f.chunks_per_group = tr.group ? tr.group / kChunkWeights : f.chunks;
    f.has_zeros = !tr.symmetric;
    f.zero = tr.implicit_zero;
    return f;
}

void repack_rows_for_gpu(const GpuMatrixFormat& fmt, const uint8_t* src, uint64_t src_stride,
                         uint64_t rows, uint8_t* dst) {
    const uint64_t used = fmt.file_row_bytes;
    for (uint64_t r = 0; r < rows; ++r) {
        uint8_t* d = dst + r * fmt.row_bytes;
        std::memcpy(d, src + r * src_stride, used);
        std::memset(d + used, 0, fmt.row_bytes - used);
    }
}

}  // namespace qforge::cuda
