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
    {GgmlType::f32, QType::f32},      {GgmlType::f16, QType::f16},
    {GgmlType::bf16, QType::bf16},    {GgmlType::q8_0, QType::q8_g32},
    {GgmlType::q4_0, QType::q4s_g32},
};

uint64_t block_bytes_of(GgmlType type) {
    return type == GgmlType::q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
}
static_assert(qtype_traits(QType::q8_g32).group == kGgmlQk &&
                  qtype_traits(QType::q4s_g32).group == kGgmlQk &&
                  qtype_traits(QType::q4s_g32).implicit_zero == 8,
              "Q8_0 and Q4_0 keep their blocks of 32 and Q4_0's zero of 8");
static_assert(sizeof(BlockQ4_0::qs) == kCodeChunk / 2, "one Q4_0 block is one 4-bit code chunk");

}  // namespace

std::optional<QType> gguf_kept_qtype(GgmlType type, std::span<const uint64_t> shape) {
    for (const auto& p : kKeptPairs) {
        if (p.ggml != type) continue;
        if (qtype_traits(p.qtype).is_float) return p.qtype;
        if (shape.size() != 2 || shape[1] == 0 || shape[1] % kGgmlQk != 0) return std::nullopt;
        return p.qtype;
    }
    return std::nullopt;
}

std::optional<GgmlType> gguf_export_type(QType qtype) {
    for (const auto& p : kKeptPairs)
        if (p.qtype == qtype) return p.ggml;
    return std::nullopt;
}

QType gguf_nearest_exportable(QType qtype) {
    const QTypeTraits& tr = qtype_traits(qtype);
    if (tr.is_float) return QType::f32;
    // 8-bit types keep their width in Q8_0; 4- and 3-bit ones fit Q4_0's 4 bits per weight.
    return tr.bits == 8 ? QType::q8_g32 : QType::q4s_g32;
}

void repack_gguf_rows(GgmlType type, QType target, std::span<const uint8_t> src, uint64_t rows,
                      uint64_t k, std::span<uint8_t> out, const std::string& file,
                      const std::string& tensor) {
    const uint64_t dims[2] = {rows, k};
    if (gguf_kept_qtype(type, dims) != target)
        throw std::logic_error("repack_gguf_rows: not a kept type");
    const QRowLayout l = *qtype_row_layout(target, k);
    const uint64_t blocks = k / kGgmlQk;
    if (qtype_traits(target).is_float)
        throw std::logic_error("repack_gguf_rows: float tensors are copied, not repacked");
    const uint64_t block_bytes = block_bytes_of(type);
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

void pack_gguf_rows(QType source, std::span<const uint8_t> src, uint64_t rows, uint64_t k,
                    std::span<uint8_t> out) {
    const std::optional<GgmlType> type = gguf_export_type(source);
    if (!type || qtype_traits(source).is_float || k == 0 || k % kGgmlQk != 0)
        throw std::logic_error("pack_gguf_rows: not a quantized kept type");
    const QRowLayout l = *qtype_row_layout(source, k);
    const uint64_t blocks = k / kGgmlQk, block_bytes = block_bytes_of(*type);
    if (src.size() != rows * l.row_bytes || out.size() != rows * blocks * block_bytes)
        throw std::logic_error("pack_gguf_rows: inconsistent sizes");
    for (uint64_t r = 0; r < rows; ++r) {
        const uint8_t* row = src.data() + r * l.row_bytes;
        for (uint64_t b = 0; b < blocks; ++b) {
            uint8_t* blk = out.data() + (r * blocks + b) * block_bytes;
            std::memcpy(blk, row + l.scales_offset + 2 * b, 2);  // the fp16 scale leads both
            if (*type == GgmlType::q8_0)
                std::memcpy(blk + offsetof(BlockQ8_0, qs), row + b * kGgmlQk, kGgmlQk);
            else
                std::memcpy(blk + offsetof(BlockQ4_0, qs), row + b * kGgmlQk / 2, kGgmlQk / 2);
        }
    }
}

}  // namespace qforge
