// The .qf container: fixed binary preamble, data section, JSON header at the end.
// docs/FORMAT.md is the specification; tests/qf_spec_test.cpp checks it against this file.
//
//   [preamble: 64 bytes][zero padding to data_offset (page aligned)]
//   [data section: tensors, each at a multiple of tensor_alignment from data_offset]
//   [JSON header: header_length bytes, ends the file]
//
// The header comes last so a writer can stream tensors of unknown compressed size and checksum
// in one pass and patch the preamble at the end; a truncated file loses its header and is
// refused at once.
#pragma once

#include <cstdint>

namespace qforge {

inline constexpr char kQfMagic[8] = {'Q', 'F', 'O', 'R', 'G', 'E', '\r', '\n'};
// The newest version this code reads and writes. 2: quantized rows packed tight (no per-row
// padding); 1: every quantized row padded to 64 bytes (read and repacked on load).
inline constexpr uint32_t kQfVersion = 2;
// 3: as 2, and a tensor may carry a column permutation (col_perm, docs/FORMAT.md). Written only
// by files that hold one (act-order imports), so every other file stays version 2 and an older
// reader refuses the permuted ones instead of misreading them. The newest version read.
inline constexpr uint32_t kQfColPermVersion = 3;
inline constexpr uint32_t kQfEndianTag = 0x01020304;  // reads as 0x04030201 on a big-endian host
inline constexpr uint64_t kQfDataAlignment = 4096;  // page: the data section can be mmap'd in place
inline constexpr uint32_t kQfTensorAlignment = 64;  // cache line, AVX2 (32 B) and 16 B GPU loads
inline constexpr uint64_t kQfMaxHeaderBytes = 256ull << 20;  // far above any real model's header

// All fields little-endian.
struct QfPreamble {
    char magic[8];              // "QFORGE\r\n": the \r\n detects text-mode line-end conversion
    uint32_t version;           // format version; a reader refuses versions newer than its own
    uint32_t endian_tag;        // kQfEndianTag as written by a little-endian host
    uint64_t header_offset;     // absolute offset of the JSON header (= data_offset + data_length)
    uint64_t header_length;     // bytes of JSON; the file ends right after it
    uint64_t data_offset;       // absolute offset of the data section; multiple of 4096
    uint64_t data_length;       // bytes of the data section, padding included
    uint64_t header_checksum;   // XXH3-64 of the JSON header bytes
    uint32_t tensor_alignment;  // every tensor offset (relative to data_offset) is a multiple
    uint32_t reserved;          // zero
};
static_assert(sizeof(QfPreamble) == 64, "the .qf preamble is 64 bytes");

enum class QfEncoding : uint8_t { raw, zstd };

}  // namespace qforge
