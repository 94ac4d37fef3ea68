// `qforge convert model.gguf --keep-quant`: GGUF tensors whose ggml blocks are exactly one of
// our quantized row types are stored in that type instead of being dequantized to float, and
// F16/BF16/F32 tensors keep their float type. `qforge export --format gguf` is the exact inverse
// (gguf_export_type, pack_gguf_rows): the pairs below are the one statement of the mapping.
//
//   Q8_0  block = fp16 d, 32 int8 q;            x = d * q        -> q8_g32  (scale d, code q)
//   Q4_0  block = fp16 d, 16 bytes of nibbles;  x = d * (q - 8)  -> q4s_g32 (scale d, zero 8)
//
// Q4_0's 16 bytes hold element i in the low nibble and i + 16 in the high nibble of byte i, the
// order of our 4-bit code chunks, so codes copy byte for byte; only the row layout changes (a
// GGUF row interleaves d and codes block by block, ours stores all codes, then all scales, then
// padding to 64 bytes). Both formulas are one binary16 times a small integer, exact in float32,
// so dequantize_row_ref gives the bits formats/gguf_dequant.cpp gives. Q8_0 codes may be -128;
// the int8 kernels take |code| as an unsigned byte, so -128 runs exactly.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "formats/gguf.hpp"
#include "formats/qtype.hpp"

namespace qforge {

// The type a GGUF tensor of this ggml type and shape (torch order) keeps: a float type for
// F32/F16/BF16 of any rank, q8_g32/q4s_g32 for Q8_0/Q4_0 matrices [rows, k] with k a multiple
// of 32; nullopt otherwise (other ggml types).
std::optional<QType> gguf_kept_qtype(GgmlType type, std::span<const uint64_t> shape);

// The inverse: the ggml type a tensor of `qtype` is written as by GGUF export, or nullopt for a
// type GGUF cannot hold bit for bit (see gguf_nearest_exportable for what to use instead).
std::optional<GgmlType> gguf_export_type(QType qtype);
// For a type gguf_export_type refuses: the exportable type closest to it (same bits where one
// exists), for the message that refuses it.
QType gguf_nearest_exportable(QType qtype);

// Repacks `rows` GGUF rows of k elements (src: the tensor's blocks) into rows of `target`
// (gguf_kept_qtype's answer; out: rows * row_bytes). A block whose scale is NaN or infinite is
// an error naming the file and the tensor.
void repack_gguf_rows(GgmlType type, QType target, std::span<const uint8_t> src, uint64_t rows,
                      uint64_t k, std::span<uint8_t> out, const std::string& file,
                      const std::string& tensor);

// The inverse of repack_gguf_rows for a quantized kept pair: `rows` rows of `source`
// (q8_g32 / q4s_g32, k weights each) into ggml blocks of gguf_export_type(source)
// (out: rows * k / 32 blocks). Bit for bit: repack_gguf_rows of the result gives `src` back.
void pack_gguf_rows(QType source, std::span<const uint8_t> src, uint64_t rows, uint64_t k,
                    std::span<uint8_t> out);

}  // namespace qforge
