// The packed layout of kernels/cpu/qpack.hpp: its sizes and the repack from rows. Plain byte
// copies (a load-time pass over each matrix once, split over threads by the caller).
#include "kernels/cpu/qpack.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace qforge {

namespace {

constexpr uint64_t kBlock = 32;
constexpr uint64_t kLine = 64;

bool packable(QType t) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.is_float || tr.row_levels) return false;
    return tr.bits == 8 || tr.bits == 4;
}

}  // namespace

uint64_t QPackLayout::meta_bytes(uint64_t nb) const {
    if (super) return kPackLanes * sizeof(QSuperRecord);
    if (group_blocks == 0) return 0;
    return round_up((nb + group_blocks - 1) / group_blocks * group_meta, kLine);
}

uint64_t QPackLayout::chunk_blocks(uint64_t c) const {
    return std::min(kPackChunkBlocks, blocks - c * kPackChunkBlocks);
}

std::optional<QPackLayout> qpack_layout(QType t, uint64_t k) {
    if (!packable(t) || k == 0) return std::nullopt;
    const QTypeTraits& tr = qtype_traits(t);
    QPackLayout p;
    p.blocks = (k + kBlock - 1) / kBlock;
    p.chunks = (p.blocks + kPackChunkBlocks - 1) / kPackChunkBlocks;
    p.block_bytes = kPackLanes * kBlock * tr.bits / 8;
    p.super = tr.super_block != 0;
    p.group_blocks = p.super ? tr.super_block / kBlock : tr.group / kBlock;
    const bool zeros = !tr.symmetric && !p.super;
    p.group_meta = p.super ? 0 : 2 * kPackLanes + (zeros ? kPackLanes : 0);
    p.header = !p.super && p.group_blocks == 0 ? round_up(p.group_meta, kLine) : 0;
    p.chunk_bytes = p.meta_bytes(kPackChunkBlocks) + kPackChunkBlocks * p.block_bytes;
    const uint64_t last = p.chunk_blocks(p.chunks - 1);
    p.tile_bytes =
        p.header + (p.chunks - 1) * p.chunk_bytes + p.meta_bytes(last) + last * p.block_bytes;
    return p;
}

QPackedRows::QPackedRows(QType t, uint64_t rows, uint64_t k) : type_(t), rows_(rows), k_(k) {
    const auto layout = qpack_layout(t, k);
    if (!layout || rows == 0)
        throw Error("packed rows: " + std::string(qtype_traits(t).name) + " with " +
                    std::to_string(rows) + " rows of " + std::to_string(k) +
                    " weights has no packed layout");
    layout_ = *layout;
    // Huge pages for large matrices: no difference measured beyond the host's noise, none lost.
    data_ = stream_buffer(bytes(), "packed rows");
}

void QPackedRows::pack(const uint8_t* w, uint64_t stride, uint64_t tile0, uint64_t tile1) {
    const QRowLayout rl = *qtype_row_layout(type_, k_);
    const QPackLayout& p = layout_;
    const uint64_t code_bytes = p.block_bytes / kPackLanes;  // per row and block: 16 or 32
    const uint64_t zeros = p.group_meta > 2 * kPackLanes;
    for (uint64_t tile = tile0; tile < tile1; ++tile) {
        uint8_t* out = data_.get() + tile * p.tile_bytes;
        std::memset(out, 0, p.tile_bytes);
        const uint8_t* row[kPackLanes];
        for (uint64_t l = 0; l < kPackLanes; ++l)
            row[l] = w + std::min(tile * kPackLanes + l, rows_ - 1) * stride;
        // One group's (g) 16 scales and zeros at `at`.
        auto group_meta = [&](uint8_t* at, uint64_t g) {
            for (uint64_t l = 0; l < kPackLanes; ++l) {
                std::memcpy(at + 2 * l, row[l] + rl.scales_offset + 2 * g, 2);
                if (zeros) at[2 * kPackLanes + l] = row[l][rl.zeros_offset + g];
            }
        };
        if (p.header) group_meta(out, 0);
        for (uint64_t c = 0; c < p.chunks; ++c) {
            uint8_t* chunk = out + p.header + c * p.chunk_bytes;
            const uint64_t nb = p.chunk_blocks(c), b0 = c * kPackChunkBlocks;
            if (p.super) {
                // Dword j of row l's record to lane l of vector j; a last partial record is
                // shorter than 16 bytes (qtype_super_record_bytes) and read only as far as it goes.
                const uint64_t at = rl.scales_offset + sizeof(QSuperRecord) * c;
                const uint64_t have = std::min<uint64_t>(sizeof(QSuperRecord), rl.row_bytes - at);
                for (uint64_t l = 0; l < kPackLanes; ++l)
                    for (uint64_t i = 0; i < have; ++i)
                        chunk[(i / 4) * kLine + 4 * l + i % 4] = row[l][at + i];
            } else if (p.group_blocks) {
                for (uint64_t b = 0; b < nb; b += p.group_blocks)
                    group_meta(chunk + b / p.group_blocks * p.group_meta,
                               (b0 + b) / p.group_blocks);
            }
            uint8_t* codes = chunk + p.meta_bytes(nb);
            for (uint64_t i = 0; i < nb; ++i)
                for (uint64_t j = 0; j < code_bytes / 4; ++j)
                    for (uint64_t l = 0; l < kPackLanes; ++l)
                        std::memcpy(codes + i * p.block_bytes + j * kLine + 4 * l,
                                    row[l] + (b0 + i) * code_bytes + 4 * j, 4);
        }
    }
}

}  // namespace qforge
