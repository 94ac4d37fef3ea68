#include "formats/zstd_frame.hpp"

#include <zstd.h>

#include <cstdio>
#include <new>

#include "core/checked_math.hpp"
#include "core/error.hpp"

namespace qforge {

namespace {

constexpr uint32_t kZstdFrameMagic = 0xFD2FB528u;

uint64_t read_le(const uint8_t* p, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
    return v;
}

}  // namespace

std::string size_with_bytes(uint64_t n) {
    const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (n < 1024) return std::to_string(n) + " bytes";
    double v = static_cast<double>(n) / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 5) v /= 1024.0, ++u;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
    return std::string(buf) + " (" + std::to_string(n) + " bytes)";
}

std::optional<ZstdFrameBound> zstd_frame_bound(std::span<const uint8_t> s, std::string& why) {
    const uint64_t size = s.size();
    const uint8_t* p = s.data();
    if (size < 5 || read_le(p, 4) != kZstdFrameMagic) {
        why = "does not start with a zstd frame (magic 28 b5 2f fd)";
        return std::nullopt;
    }
    const uint8_t fhd = p[4];
    if (fhd & 0x08) {
        why = "zstd frame header has its reserved bit set";
        return std::nullopt;
    }
    const unsigned fcs_flag = fhd >> 6;
    const bool single_segment = (fhd >> 5) & 1;
    const bool has_checksum = (fhd >> 2) & 1;
    static constexpr uint64_t kDictIdBytes[4] = {0, 1, 2, 4};
    static constexpr uint64_t kFcsBytes[4] = {0, 2, 4, 8};
    const uint64_t fcs_bytes = fcs_flag == 0 && single_segment ? 1 : kFcsBytes[fcs_flag];
    uint64_t at = 5 + (single_segment ? 0 : 1) + kDictIdBytes[fhd & 3];
    if (at + fcs_bytes > size) {
        why = "zstd frame header is truncated";
        return std::nullopt;
    }
    ZstdFrameBound b;
    if (fcs_bytes) b.content_size = read_le(p + at, fcs_bytes) + (fcs_bytes == 2 ? 256 : 0);
    at += fcs_bytes;
    for (uint64_t block = 0;; ++block) {
        if (size - at < 3) {
            why = "zstd frame is truncated: block " + std::to_string(block) + " header at byte " +
                  std::to_string(at) + " is missing (the frame has no last block)";
            return std::nullopt;
        }
        const uint32_t h = static_cast<uint32_t>(read_le(p + at, 3));
        at += 3;
        const bool last = h & 1;
        const unsigned type = (h >> 1) & 3;
        const uint64_t block_size = h >> 3;
        if (type == 3 || block_size > kZstdMaxBlockBytes) {
            why = "zstd block " + std::to_string(block) + " at byte " + std::to_string(at - 3) +
                  (type == 3 ? " has the reserved block type"
                             : " declares " + std::to_string(block_size) + " bytes, above 128 KiB");
            return std::nullopt;
        }
        const uint64_t content = type == 1 ? 1 : block_size;  // RLE: one byte repeated
        const uint64_t regenerated = type == 2 ? kZstdMaxBlockBytes : block_size;
        if (content > size - at) {
            why = "zstd frame is truncated: block " + std::to_string(block) + " needs " +
                  std::to_string(content) + " bytes at byte " + std::to_string(at) + ", " +
                  std::to_string(size - at) + " left";
            return std::nullopt;
        }
        at += content;
        b.max_content += regenerated;  // cannot overflow: at most 2^17 per byte of input
        if (last) break;
    }
    if (has_checksum) {
        if (size - at < 4) {
            why = "zstd frame is truncated: its 4-byte checksum is missing";
            return std::nullopt;
        }
        at += 4;
    }
    b.frame_bytes = at;
    return b;
}

void zstd_decode_exact(std::span<const uint8_t> stored, uint64_t expected, const std::string& file,
                       const std::string& tensor, std::vector<uint8_t>& out) {
    const auto fail = [&](const std::string& what) { return Error(file, tensor, what); };
    const std::string from = " from " + std::to_string(stored.size()) + " stored bytes";
    const auto ratio_bound = checked_mul(stored.size(), kZstdMaxRatio);
    if (ratio_bound && expected > *ratio_bound)
        throw fail("declares " + size_with_bytes(expected) + " uncompressed" + from +
                   "; zstd cannot expand more than " + std::to_string(kZstdMaxRatio) + ":1");
    std::string why;
    const auto bound = zstd_frame_bound(stored, why);
    if (!bound) throw fail("zstd data" + from + ": " + why);
    if (bound->frame_bytes != stored.size())
        throw fail("zstd frame ends at byte " + std::to_string(bound->frame_bytes) + " of the " +
                   std::to_string(stored.size()) + " stored bytes (expected exactly one frame)");
    if (!bound->content_size)
        throw fail("zstd frame does not declare its size, expected " + std::to_string(expected) +
                   " bytes");
    if (*bound->content_size != expected)
        throw fail("zstd frame declares " + std::to_string(*bound->content_size) +
                   " bytes, expected " + std::to_string(expected));
    if (expected > bound->max_content)
        throw fail("declares " + size_with_bytes(expected) + " uncompressed" + from +
                   ", but the blocks of its zstd frame regenerate at most " +
                   std::to_string(bound->max_content) + " bytes");
    try {
        out.resize(static_cast<size_t>(expected));
    } catch (const std::bad_alloc&) {
        throw fail("cannot allocate " + size_with_bytes(expected) + " to decompress it");
    } catch (const std::length_error&) {
        throw fail("cannot allocate " + size_with_bytes(expected) + " to decompress it");
    }
    const size_t got = ZSTD_decompress(out.data(), out.size(), stored.data(), stored.size());
    if (ZSTD_isError(got))
        throw fail(std::string("zstd data does not decode: ") + ZSTD_getErrorName(got));
    if (got != expected)
        throw fail("zstd data decodes to " + std::to_string(got) + " bytes, expected " +
                   std::to_string(expected));
}

}  // namespace qforge
