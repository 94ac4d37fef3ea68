#include "kernels/cuda/plans.hpp"

#include <algorithm>
#include <string>

namespace qforge::cuda {

namespace {
uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
}  // namespace

std::string_view matmul_path_name(MatmulPath p) {
    switch (p) {
        case MatmulPath::gemv:
            return "gemv";
        case MatmulPath::mma:
            return "mma";
        case MatmulPath::cublas:
            return "cublas";
    }
    return "?";
}

bool matmul_path_applies(MatmulPath p, const GpuMatrixFormat& fmt, int cc_major) {
    switch (p) {
        case MatmulPath::gemv:
            return true;
        case MatmulPath::mma:
            return cuda_qtype_row(fmt.qtype).tensor_core_gemm && cc_major >= 8;
        case MatmulPath::cublas:
            return fmt.quantized() || fmt.kind == WeightKind::f16 ||
                   (fmt.kind == WeightKind::bf16 && cc_major >= 8);
    }
    return false;
}

MatmulPath choose_matmul_path(const GpuMatrixFormat& fmt, uint64_t m, int cc_major) {
    if (m <= kGemvMaxTokens) return MatmulPath::gemv;
    if (fmt.kind == WeightKind::f32) return MatmulPath::gemv;
    if (fmt.kind == WeightKind::bf16)
        return m >= kBf16CublasMinTokens && matmul_path_applies(MatmulPath::cublas, fmt, cc_major)
                   ? MatmulPath::cublas
                   : MatmulPath::gemv;
    if (fmt.kind == WeightKind::f16) return MatmulPath::cublas;
    if (m <= kMmaMaxTokens && matmul_path_applies(MatmulPath::mma, fmt, cc_major))
        return MatmulPath::mma;
    return MatmulPath::cublas;
}

uint32_t gemv_rows_per_block(WeightKind kind) {
    switch (kind) {
        case WeightKind::q4:
            return 4;
        case WeightKind::q8:
            return 2;
        case WeightKind::f16:
        case WeightKind::bf16:
        case WeightKind::f32:
            return 1;
    }
    return 1;
}

GemvPlan plan_gemv(const GpuMatrixFormat& fmt, uint64_t rows, uint64_t m,
                   const GemvTuning& tuning) {
    GemvPlan p;
    const uint64_t tile = std::min(m, kGemvMaxTokens);
    p.token_tile = tile <= 1 ? 1 : tile <= 2 ? 2 : tile <= 4 ? 4 : 8;
    p.rows_per_block = gemv_rows_per_block(fmt.kind);
    // q4 at 1-2 tokens: 2 rows per block for rows of 256 chunks or more (k >= 8192: Llama's
    // down_proj, few rows: twice the resident blocks), measured 51% -> 59% of copy on the H200
    // (4096 x 14336) and slower on shorter rows (plans.hpp: GemvTuning).
    const uint32_t q4_rows = tuning.q4_rows ? tuning.q4_rows : (fmt.chunks >= 256 ? 2 : 4);
    if (fmt.kind == WeightKind::q4 && p.token_tile <= 2 && q4_rows == 2) p.rows_per_block = 2;
    p.blocks = ceil_div(rows, p.rows_per_block);
    const bool quantized = fmt.kind == WeightKind::q4 || fmt.kind == WeightKind::q8;
    const uint32_t order_tile = tuning.one_token_threads ? 1 : p.token_tile;
    const uint64_t min_steps =
        tuning.min_steps ? tuning.min_steps : (quantized && order_tile <= 2 ? 2 : 1);
    // As few chunk steps as 256 threads allow (at least min_steps), then the fewest whole warps
    // for that many steps (k = 14336 at q4: 448 chunks -> 2 steps of 224 threads, not 256 + 192).
    const uint64_t steps = std::max(ceil_div(fmt.chunks, kGemvMaxThreads), min_steps);
    p.threads =
        static_cast<uint32_t>(std::max<uint64_t>(32, round_up(ceil_div(fmt.chunks, steps), 32)));
    p.chunk_steps = static_cast<uint32_t>(ceil_div(fmt.chunks, p.threads));
    p.passes = std::max<uint64_t>(1, ceil_div(m, kGemvMaxTokens));
    return p;
}

bool parse_gemv_tuning(std::string_view s, GemvTuning& out) {
    GemvTuning t;
    while (true) {
        const size_t comma = s.find(',');
        const std::string_view item = s.substr(0, comma);
        if (item.size() == 7 && item.substr(0, 6) == "steps=" && item[6] >= '1' && item[6] <= '4')
            t.min_steps = static_cast<uint32_t>(item[6] - '0');
        else if (item == "rows=2" || item == "rows=4")
            t.q4_rows = static_cast<uint32_t>(item[5] - '0');
        else
            return false;
        if (comma == std::string_view::npos) break;
        s = s.substr(comma + 1);
    }
    out = t;
    return true;
}

MmaPlan plan_mma(const GpuMatrixFormat& fmt, uint64_t rows, uint64_t m, int sm_count) {
    MmaPlan p;
    p.row_tiles = ceil_div(rows, kMmaTileRows);
    p.token_tiles = ceil_div(m, kMmaTileTokens);
    const uint64_t base = p.row_tiles * p.token_tiles;
    const uint64_t target = 8 * static_cast<uint64_t>(std::max(sm_count, 1));
    // Each warp should keep at least 4 chunks, so a split holds at least 16.
    const uint64_t max_splits = std::max<uint64_t>(1, fmt.chunks / (4 * kMmaWarps));
    const uint64_t want = base >= target ? 1 : ceil_div(target, base);
    const uint64_t splits = std::min({want, max_splits, uint64_t{64}});
    p.chunks_per_split = ceil_div(fmt.chunks, splits);
    p.splits = static_cast<uint32_t>(ceil_div(fmt.chunks, p.chunks_per_split));  // none empty
    p.workspace_floats = p.splits > 1 ? p.splits * m * rows : 0;
    return p;
}

uint64_t cublas_slab_rows(const GpuMatrixFormat& fmt, uint64_t rows, uint64_t scratch_halves) {
    const uint64_t per_row = fmt.kind == WeightKind::bf16 ? 2 * fmt.kpad : fmt.kpad;
    return std::clamp<uint64_t>(scratch_halves / per_row, 1, rows);
}

void check_attention_config(uint64_t head_dim, uint64_t num_heads, uint64_t num_kv_heads) {
    if (head_dim == 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim)
        throw UnsupportedOnCuda("attention with head_dim " + std::to_string(head_dim) +
                                " (even values up to " + std::to_string(kMaxHeadDim) +
                                " are supported)");
    if (num_kv_heads == 0 || num_heads % num_kv_heads != 0)
        throw UnsupportedOnCuda("attention with " + std::to_string(num_heads) +
                                " query heads over " + std::to_string(num_kv_heads) +
                                " key/value heads");
}

uint32_t attention_dims_per_lane(uint64_t head_dim) {
    const uint64_t per_lane = ceil_div(head_dim, 32);
    return per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : per_lane <= 4 ? 4 : 8;
}

uint32_t attention_split_len(uint32_t capacity) {
    // At least 64 positions a slice (a warp's 16 keys), at most kAttnMaxSplits slices.
    const uint32_t len = (capacity + kAttnMaxSplits - 1) / kAttnMaxSplits;
    return std::max<uint32_t>(64, (len + 31) / 32 * 32);
}

uint64_t attention_workspace_floats(uint32_t n, uint32_t heads, uint32_t head_dim) {
    return static_cast<uint64_t>(n) * heads * kAttnMaxSplits * 4 * (head_dim + 2);
}

}  // namespace qforge::cuda
