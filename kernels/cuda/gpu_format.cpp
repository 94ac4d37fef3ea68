#include "kernels/cuda/gpu_format.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/half.hpp"

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
    if (row.carrier != qtype) {  // held as its carrier's rows, transcoded at load
        GpuMatrixFormat f = gpu_matrix_format(row.carrier, k);
        f.source = qtype;
        f.file_row_bytes = *qtype_row_bytes(qtype, k);
        return f;
    }
    if (k == 0 || k > kMaxGpuDim)
        throw UnsupportedOnCuda("rows of " + std::to_string(k) + " weights (1 .. " +
                                std::to_string(kMaxGpuDim) + " supported)");
    GpuMatrixFormat f;
    f.qtype = qtype;
    f.source = qtype;
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
    if (tr.super_block) {  // a super row: codes, f32 scales, f32 mins
        f.scales_offset = f.chunks * 16;
        f.mins_offset = f.scales_offset + 4 * l.groups;
        f.row_bytes = round_up(f.mins_offset + 4 * l.groups, kGpuRowAlign);
        f.zeros_offset = f.row_bytes;
        f.chunks_per_group = 1;
        f.super_rows = true;
        return f;
    }
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
    const bool transcoded = fmt.source != fmt.qtype;
    const uint64_t used = transcoded ? *qtype_row_bytes(fmt.qtype, fmt.k) : fmt.file_row_bytes;
    auto run = [&](uint64_t r0, uint64_t r1) {
        for (uint64_t r = r0; r < r1; ++r) {
            uint8_t* d = dst + r * fmt.row_bytes;
            if (fmt.super_rows) {
                super_row(fmt, src + r * src_stride, d);
                continue;
            }
            if (transcoded)
                transcode_row(fmt.source, src + r * src_stride, fmt.k, fmt.qtype, d);
            else
                std::memcpy(d, src + r * src_stride, used);
            std::memset(d + used, 0, fmt.row_bytes - used);
        }
    };
    // Transcoding decodes every weight (a few ns each): a large matrix's rows on every core, so
    // loading a 7-8B model of these types takes seconds, not a minute.
    const uint64_t threads = std::min<uint64_t>(std::max(1u, std::thread::hardware_concurrency()),
                                                rows * fmt.k / (uint64_t{1} << 20) + 1);
    if (!(transcoded || fmt.super_rows) || threads < 2) return run(0, rows);
    std::vector<std::thread> pool;
    std::exception_ptr error;
    std::mutex error_mutex;
    for (uint64_t i = 0; i < threads; ++i)
        pool.emplace_back([&, i] {
            try {
                run(rows * i / threads, rows * (i + 1) / threads);
            } catch (...) {
                const std::lock_guard lock(error_mutex);
                if (!error) error = std::current_exception();
            }
        });
    for (auto& t : pool) t.join();
    if (error) std::rethrow_exception(error);
}

void super_row(const GpuMatrixFormat& fmt, const uint8_t* row, uint8_t* out) {
    const QType t = fmt.source;
    const uint64_t k = fmt.k, groups = (k + 31) / 32;
    if (!fmt.super_rows || !qtype_has_super_blocks(t))
        throw Error("super_row: " + std::string(qtype_traits(t).name) + " rows are not super rows");
    std::memset(out, 0, fmt.row_bytes);
    for (uint64_t j = 0; j < k; ++j) {  // chunk j / 32: byte i = weight i low, i + 16 high
        const uint64_t i = j % 32;
        const auto code = static_cast<uint8_t>(row_code(t, row, j));
        out[j / 32 * 16 + i % 16] |= static_cast<uint8_t>(i < 16 ? code : code << 4);
    }
    for (uint64_t g = 0; g < groups; ++g) {
        const float scale = row_group_scale(t, row, k, g), min = row_group_min(t, row, k, g);
        std::memcpy(out + fmt.scales_offset + 4 * g, &scale, 4);
        std::memcpy(out + fmt.mins_offset + 4 * g, &min, 4);
    }
}

void transcode_row(QType from, const uint8_t* row, uint64_t k, QType to, uint8_t* out) {
    const QTypeTraits &tf = qtype_traits(from), &tt = qtype_traits(to);
    if (cuda_qtype_row(from).carrier != to || from == to || tf.group != tt.group ||
        tf.super_block || tt.super_block)
        throw Error("transcode_row: " + std::string(tt.name) + " does not carry " +
                    std::string(tf.name) + " rows");
    const uint64_t groups = (k + tf.group - 1) / tf.group;
    const int8_t* levels = row_levels(from, row, k);
    std::vector<int32_t> codes(k);
    for (uint64_t j = 0; j < k; ++j)
        codes[j] = qtype_code_level(from, row_code(from, row, j), levels);
    std::vector<QGroupParams> g(groups);
    for (uint64_t i = 0; i < groups; ++i) {
        g[i].scale = row_group_scale(from, row, k, i);
        g[i].scale_bits = f32_to_f16(g[i].scale);  // it was an fp16: the same bits
        g[i].zero = tt.symmetric ? tt.implicit_zero : row_group_zero(from, row, k, i);
    }
    pack_row(to, codes.data(), g.data(), k, out);
}

}  // namespace qforge::cuda
