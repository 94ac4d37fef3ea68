// How a weight matrix of each qtype lives in GPU memory, which qtypes the CUDA kernels support,
// and the host-side repack from the .qf row layout. Plain C++ (no CUDA headers), so it builds and
// is unit-tested on machines without a GPU.
//
// GPU layout, per row (formats/qtype.hpp has the .qf row layout it derives from):
//   quantized  the .qf row's bytes unchanged: codes in 16-byte chunks of 32 weights (4-bit: byte
//              i = weight i low nibble, weight i + 16 high nibble; 8-bit: one int8 per weight),
//              then fp16 scales, then uint8 zeros, then zeros up to a multiple of kGpuRowAlign:
//              .qf rows are packed tight (no padding, any stride), so rows are copied to the
//              padded GPU stride at load, and every row starts on a 64-byte boundary (a 16-byte
//              load is one 4-bit chunk, aligned).
//   f32/f16/bf16  the .qf row (k elements, not padded) is repacked at load: elements past k up to
//              round_up(k, 32) are zero, so every row is whole 32-weight chunks and starts on a
//              64-byte boundary (16-byte loads of any chunk are aligned).
// So every kernel walks a row as `chunks` = round_up(k, 32) / 32 chunks of 32 weights; weights
// past k are exactly zero and contribute nothing as long as the activations there are finite.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "formats/qtype.hpp"
#include "kernels/cuda/weight_kind.hpp"

namespace qforge::cuda {

inline constexpr uint64_t kGpuRowAlign = 64;  // GPU row stride: 16-byte loads of any chunk aligned

// Thrown by every CUDA entry point for a configuration it does not support (a qtype without
// kernels, a head_dim outside the attention table, a forced path that does not apply). The message
// names the configuration; callers may fall back to the CPU backend.
class UnsupportedOnCuda : public Error {
  public:
    explicit UnsupportedOnCuda(const std::string& configuration)
        : Error("unsupported on CUDA: " + configuration), configuration_(configuration) {}
    // The same, naming the model file and tensor it arose in.
    UnsupportedOnCuda(const std::string& file, const std::string& tensor,
                      const std::string& configuration)
        : Error(file, tensor, "unsupported on CUDA: " + configuration),
          configuration_(configuration) {}

    const std::string& configuration() const { return configuration_; }

  private:
    std::string configuration_;
};

// Per qtype: whether the CUDA kernels run it, and with which family. One row per QType (a static
// check below); a qtype added to formats/qtype.hpp without kernels gets `supported = false` and
// every entry point throws UnsupportedOnCuda for it. `carrier`: the qtype whose rows the GPU
// holds; a qtype without kernels of its own whose every value another qtype's row holds exactly
// (the same fp16 scales, integer codes and zeros) is transcoded to it at load (transcode_row),
// and kind and fused mma are then the carrier's.
struct CudaQTypeRow {
    QType type;
    bool supported;
    WeightKind kind;
    bool tensor_core_gemm;  // the fused mma.sync kernel reads it (integer codes, exact in fp16)
    QType carrier;
};

inline constexpr CudaQTypeRow kCudaQTypes[] = {
    // type          supported kind              fused mma  carrier
    {QType::f32, true, WeightKind::f32, false, QType::f32},
    {QType::f16, true, WeightKind::f16, false, QType::f16},  // prefill: cuBLAS reads it directly
    {QType::bf16, true, WeightKind::bf16, false, QType::bf16},
    {QType::q8, true, WeightKind::q8, true, QType::q8},
    {QType::q8_g32, true, WeightKind::q8, true, QType::q8_g32},
    {QType::q8_g128, true, WeightKind::q8, true, QType::q8_g128},
    {QType::q4_g32, true, WeightKind::q4, true, QType::q4_g32},
    {QType::q4_g64, true, WeightKind::q4, true, QType::q4_g64},
    {QType::q4_g128, true, WeightKind::q4, true, QType::q4_g128},
    {QType::q4s_g32, true, WeightKind::q4, true, QType::q4s_g32},
    {QType::q4s_g64, true, WeightKind::q4, true, QType::q4s_g64},
    {QType::q4s_g128, true, WeightKind::q4, true, QType::q4s_g128},
    // 3-bit codes and zeros, carried as 4-bit ones (a third more bytes than the file's; no 3-bit
    // kernel yet).
    {QType::q3_g32, true, WeightKind::q4, true, QType::q4_g32},
    {QType::q3_g128, true, WeightKind::q4, true, QType::q4_g128},
    // Super-block types (w = scale * code - min, scale = d * sc and min = dmin * mn, both exact
    // in f32): GPU rows of 4-bit codes with each group's scale and min as f32 (a super row,
    // GpuMatrixFormat::super_rows; 5 bits per weight against the file's 4.5). No integer zero
    // holds the min, so the fused mma kernel does not read them: prefill takes cuBLAS. 3-bit
    // codes are carried as 4-bit ones.
    {QType::q4k_g32, true, WeightKind::q4, false, QType::q4k_g32},
    {QType::q3k_g32, true, WeightKind::q4, false, QType::q4k_g32},
    // Non-uniform 4-bit levels: each code's level (an int8) as an 8-bit code with the group's
    // scale (twice the file's bytes; no table-lookup kernel yet).
    {QType::q4nl_g32, true, WeightKind::q8, true, QType::q8_g32},
    {QType::q4t_g32, true, WeightKind::q8, true, QType::q8_g32},
};

constexpr bool cuda_qtype_table_in_enum_order() {
    for (size_t i = 0; i < std::size(kCudaQTypes); ++i)
        if (static_cast<size_t>(kCudaQTypes[i].type) != i) return false;
    return true;
}
static_assert(std::size(kCudaQTypes) == kQTypeCount, "every QType needs a row in kCudaQTypes");
static_assert(cuda_qtype_table_in_enum_order(), "kCudaQTypes rows must follow the QType order");

constexpr const CudaQTypeRow& cuda_qtype_row(QType t) {
    return kCudaQTypes[static_cast<size_t>(t)];
}

inline constexpr uint64_t kChunkWeights = 32;  // weights per chunk, every kind
// Rows and k are 32-bit in the kernels' index arithmetic.
inline constexpr uint64_t kMaxGpuDim = (uint64_t{1} << 31) - 1;

// The GPU layout of a matrix of `k` weights per row.
struct GpuMatrixFormat {
    QType qtype = QType::f32;   // the rows' qtype on the GPU (the carrier)
    QType source = QType::f32;  // the file's: its rows are transcoded at load when not qtype
    WeightKind kind = WeightKind::f32;
    uint64_t k = 0;
    uint64_t kpad = 0;            // round_up(k, 32): weights per row the kernels walk
    uint64_t chunks = 0;          // kpad / 32
    uint64_t row_bytes = 0;       // GPU row stride, a multiple of 64
    uint64_t file_row_bytes = 0;  // the .qf row stride (qtype_row_bytes)
    // Quantized only:
    uint64_t scales_offset = 0;     // fp16 scales within a row
    uint64_t zeros_offset = 0;      // uint8 zeros within a row (has_zeros)
    uint64_t chunks_per_group = 0;  // group / 32; `chunks` for one scale per row
    bool has_zeros = false;         // asymmetric: a stored zero per group
    int32_t zero = 0;               // symmetric: the implicit zero code
    // Super rows (super-block types): the scales are f32, one per group at scales_offset, and
    // the mins f32 at mins_offset (w = scale * code - min; zero 0): the records unpacked at load.
    // The codes past k are 0 and their weights -min, which only ever meet zero activations.
    bool super_rows = false;
    uint64_t mins_offset = 0;

    bool quantized() const { return kind == WeightKind::q8 || kind == WeightKind::q4; }
    bool repacked() const { return row_bytes != file_row_bytes || source != qtype || super_rows; }
    // Bytes of one 32-weight chunk's codes or elements.
    uint64_t chunk_bytes() const;
};

// The GPU layout for `qtype` rows of k weights. Throws UnsupportedOnCuda for a qtype the kernels
// do not read, k == 0 or k above kMaxGpuDim.
GpuMatrixFormat gpu_matrix_format(QType qtype, uint64_t k);

// Copies `rows` rows from the .qf layout (`src`, rows `src_stride` bytes apart) into the GPU
// layout (`dst`, rows * fmt.row_bytes bytes): each row's file_row_bytes verbatim (a carried
// qtype's row transcoded), then zeros up to the GPU stride (float rows: zeros from element k up
// to the padded width).
void repack_rows_for_gpu(const GpuMatrixFormat& fmt, const uint8_t* src, uint64_t src_stride,
                         uint64_t rows, uint8_t* dst);

// A row of k weights of qtype `from` rewritten as a row of its carrier `to` (kCudaQTypes) with the
// same values: each code's level (the code itself for uniform types), the group's fp16 scale and
// zero, so dequantize_row_ref gives the same floats and the int8 products the same integers.
// Throws Error for a pair that is not a carrier's, or a super-block type (super_row).
void transcode_row(QType from, const uint8_t* row, uint64_t k, QType to, uint8_t* out);

// A super-block type's row of k weights as the GPU's super row of `fmt` (fmt.row_bytes bytes):
// codes in 4-bit chunks, zero past k, then each group's scale and min as f32, then zeros.
void super_row(const GpuMatrixFormat& fmt, const uint8_t* row, uint8_t* out);

}  // namespace qforge::cuda
