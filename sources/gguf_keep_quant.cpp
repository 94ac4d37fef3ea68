#include "sources/gguf_keep_quant.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "core/error.hpp"
#include "core/half.hpp"
#include "formats/gguf_dequant.hpp"

namespace qforge {

namespace {

// A kept pair: the ggml block and the row type with the same codes and scale per 32.
struct KeptPair {
    GgmlType ggml;
    QType qtype;
};
constexpr KeptPair kKeptPairs[] = {
    {GgmlType::q8_0, QType::q8_g32},
    {GgmlType::q4_0, QType::q4s_g32},
};
static_assert(qtype_traits(QType::q8_g32).group == kGgmlQk &&
                  qtype_traits(QType::q4s_g32).group == kGgmlQk &&
                  qtype_traits(QType::q4s_g32).implicit_zero == 8,
              "Q8_0 and Q4_0 keep their blocks of 32 and Q4_0's zero of 8");
static_assert(sizeof(BlockQ4_0::qs) == kCodeChunk / 2, "one Q4_0 block is one 4-bit code chunk");

}  // namespace

std::optional<QType> gguf_kept_qtype(GgmlType type, std::span<const uint64_t> shape) {
    if (shape.size() != 2 || shape[1] == 0 || shape[1] % kGgmlQk != 0) return std::nullopt;
    for (const auto& p : kKeptPairs)
        if (p.ggml == type) return p.qtype;
    return std::nullopt;
}

void repack_gguf_rows(GgmlType type, QType target, std::span<const uint8_t> src, uint64_t rows,
                      uint64_t k, std::span<uint8_t> out, const std::string& file,
                      const std::string& tensor) {
    const uint64_t dims[2] = {rows, k};
    if (gguf_kept_qtype(type, dims) != target)
        throw std::logic_error("repack_gguf_rows: not a kept type");
    const QRowLayout l = *qtype_row_layout(target, k);
    const uint64_t blocks = k / kGgmlQk;
    const uint64_t block_bytes = type == GgmlType::q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
    if (src.size() != rows * blocks * block_bytes || out.size() != rows * l.row_bytes)
        throw std::logic_error("repack_gguf_rows: inconsistent sizes");
    std::memset(out.data(), 0, out.size());
    for (uint64_t r = 0; r < rows; ++r) {
        uint8_t* row = out.data() + r * l.row_bytes;
        for (uint64_t b = 0; b < blocks; ++b) {
            const uint8_t* blk = src.data() + (r * blocks + b) * block_bytes;
            uint16_t d;  // both blocks start with the fp16 scale
            std::memcpy(&d, blk, sizeof d);
            if (!std::isfinite(f16_to_f32(d)))
                throw Error(
                    file, tensor,
                    "block " + std::to_string(r * blocks + b) + " has a NaN or infinite scale");
            std::memcpy(row + l.scales_offset + 2 * b, &d, sizeof d);
            if (type == GgmlType::q8_0)
                std::memcpy(row + b * kGgmlQk, blk + offsetof(BlockQ8_0, qs), kGgmlQk);
            else
                std::memcpy(row + b * kGgmlQk / 2, blk + offsetof(BlockQ4_0, qs), kGgmlQk / 2);
        }
    }
}

}  // namespace qforge
