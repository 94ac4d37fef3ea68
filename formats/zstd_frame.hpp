// Decoding one zstd frame whose decompressed size comes from an untrusted header. The size is
// bounded by what the stored bytes can produce before anything is allocated for it: zstd's
// frame format (RFC 8878) caps every block, so walking the block headers gives an exact upper
// bound without decompressing.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace qforge {

// The most a zstd block can regenerate (RFC 8878, Block_Maximum_Size).
inline constexpr uint64_t kZstdMaxBlockBytes = uint64_t{128} << 10;
// The highest ratio any zstd frame can reach: an RLE block, 3 bytes of header and 1 byte of
// content, regenerates at most 128 KiB. A declared size above stored * this is impossible.
inline constexpr uint64_t kZstdMaxRatio = kZstdMaxBlockBytes / 4;

struct ZstdFrameBound {
    uint64_t frame_bytes = 0;              // the frame's length, header to checksum
    uint64_t max_content = 0;              // the most its blocks can regenerate
    std::optional<uint64_t> content_size;  // Frame_Content_Size, when the header has one
};

// Walks one frame's header and block headers. Returns nullopt with `why` set when the bytes do
// not start with a complete, well-formed frame.
std::optional<ZstdFrameBound> zstd_frame_bound(std::span<const uint8_t> stored, std::string& why);

// Decodes `stored`, which must be exactly one zstd frame of exactly `expected` bytes, into
// `out`. Every check that does not need the output runs before `out` is sized, so a frame that
// cannot hold `expected` bytes never causes an allocation of that size. Errors name `file` and
// `tensor` (either may be empty) and say what was found and what was expected.
void zstd_decode_exact(std::span<const uint8_t> stored, uint64_t expected, const std::string& file,
                       const std::string& tensor, std::vector<uint8_t>& out);

// "1.50 GiB (1610612736 bytes)": a size a reader may want to quote in an error.
std::string size_with_bytes(uint64_t n);

}  // namespace qforge
