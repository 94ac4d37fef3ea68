// Quantized rows repacked once, at load, for the x86 kernels (avx512: 16 rows a zmm; avx2,
// qpack_avx2_kernels.hpp: two halves of 8 rows a ymm, q8*, q4_g*, q4s_g*, q4k_g32): 16 rows
// interleaved per tile, each block's codes already in the lanes the kernel multiplies them in, and
// the scales (zeros, super-block records) of those 16 rows beside them. The kernel then reads one
// sequential stream per 16 rows instead of 16 rows a few bytes at a time and transposing each
// block (the transpose was most of an AVX-512 decode's work per byte, kernels/README.md,
// "Repacked rows"). The bytes per weight are the file's, plus at most a cache line of padding
// per 8 blocks of a tile.
//
// A tile (16 rows; lane l holds row 16 i + l, and a last partial tile repeats the matrix's last
// row in its spare lanes) is, in order:
//   header   per-row-scale types (q8): the 16 rows' fp16 scales (32 bytes), padded to 64.
//   chunks   one per 8 blocks of 32 weights (the last may hold fewer), each
//     meta   super-block types (q4k): the 16 rows' 16-byte records of this superblock, as 4
//            vectors of 64 bytes, vector j holding dword j of row l's record in lane l.
//            Grouped types: for each weight group that starts in this chunk, the 16 rows' fp16
//            scales (32 bytes) and, where the type stores zeros, their uint8 zeros (16 bytes);
//            the whole padded to a multiple of 64 bytes.
//     codes  per block, vectors of 64 bytes, vector j holding in lane l the 4 bytes the kernel
//            multiplies by activations 4j .. 4j + 3: 4-bit types 4 vectors (bytes 4j .. 4j + 3
//            of row l's 16 bytes of the block: weights 4j.. in their low nibbles, 16 + 4j.. in
//            their high ones), 8-bit types 8 vectors (bytes 4j .. 4j + 3 of its 32).
// Everything is 64-byte aligned, so the kernel's loads are aligned.
//
// Types with a packed layout: q8*, q4_g*, q4s_g*, q4nl_g32 (one table for all rows) and q4k_g32.
// The 3-bit types and q4t (a table per row) keep the row layout's kernels.
#pragma once

#include <cstdint>
#include <optional>

#include "core/alloc.hpp"
#include "formats/qtype.hpp"

namespace qforge {

inline constexpr uint64_t kPackLanes = 16;       // rows per tile
inline constexpr uint64_t kPackChunkBlocks = 8;  // blocks per chunk (one superblock)

struct QPackLayout {
    uint64_t blocks = 0;        // ceil(k / 32)
    uint64_t chunks = 0;        // ceil(blocks / 8)
    uint64_t block_bytes = 0;   // codes of one block of 16 rows: 256 (4-bit) or 512 (8-bit)
    uint64_t group_blocks = 0;  // blocks per weight group; 0: one group per row
    uint64_t group_meta = 0;    // bytes per group in a chunk's meta: 32 or 48 (0: super)
    bool super = false;         // super-block records in each chunk's meta
    uint64_t header = 0;        // per-row scales: 64; else 0
    uint64_t chunk_bytes = 0;   // a whole chunk (meta and codes); chunk c is at header + c * it
    uint64_t tile_bytes = 0;    // the last chunk may be shorter

    // Bytes of the meta of a chunk of nb blocks (its codes follow).
    uint64_t meta_bytes(uint64_t nb) const;
    // Blocks in chunk c.
    uint64_t chunk_blocks(uint64_t c) const;
};

// The packed layout of rows of k weights of type t; nullopt for types without one (above).
std::optional<QPackLayout> qpack_layout(QType t, uint64_t k);

// A matrix of quantized rows in the packed layout, in 64-byte aligned memory it owns.
class QPackedRows {
  public:
    QPackedRows() = default;
    // Room for `rows` rows of k weights of type t (throws qforge::Error for a type without a
    // packed layout, or no rows).
    QPackedRows(QType t, uint64_t rows, uint64_t k);

    // Packs tiles [tile0, tile1) from w (rows `stride` bytes apart, qtype_row_bytes): callers may
    // split the tiles over threads.
    void pack(const uint8_t* w, uint64_t stride, uint64_t tile0, uint64_t tile1);

    QType type() const { return type_; }
    uint64_t rows() const { return rows_; }
    uint64_t k() const { return k_; }
    uint64_t tiles() const { return (rows_ + kPackLanes - 1) / kPackLanes; }
    const QPackLayout& layout() const { return layout_; }
    const uint8_t* tile(uint64_t i) const { return data_.get() + i * layout_.tile_bytes; }
    uint64_t bytes() const { return tiles() * layout_.tile_bytes; }

  private:
    QType type_ = QType::f32;
    uint64_t rows_ = 0, k_ = 0;
    QPackLayout layout_{};
    AlignedBytes data_;
};

}  // namespace qforge
