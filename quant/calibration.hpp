// Calibration data for GPTQ and AWQ: plain text files tokenized with the model's own tokenizer,
// and `nsamples` windows of `seqlen` tokens drawn at seeded random positions (as GPTQ's and
// AutoGPTQ's loaders do), each starting with BOS when the model's tokenizer adds one. The
// recipe and an xxh3-64 hash of the chosen token ids go into the .qf header, so a quantization
// says exactly which data it saw.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.hpp"

namespace qforge {

// The precision of the calibration pass's products: the block forward's linears, its attention's
// Q K^T and P V, and the Hessians' x^T x (quant/block_forward.hpp, quant/hessian.hpp).
//   f32   float32 inputs, OpenBLAS sgemm / ssyrk (the exact mode).
//   bf16  inputs rounded to bf16 (8 significant bits), each product exact in f32, summed in f32
//         by AVX-512 BF16's vdpbf16ps or AMX tiles (kernels/cpu/bf16_gemm.hpp): twice the f32
//         rate and more. The GPU tools that quantize with GPTQ and AWQ run their calibration
//         forward in bf16 or fp16 the same way (attention included); README.md gives the
//         measured cost.
// Softmax, norms, activations and all of GPTQ's and AWQ's own algebra stay f32 / f64 in both.
enum class CalibProducts : uint8_t { f32, bf16 };
std::string_view calib_products_name(CalibProducts p);
// bf16 where this process can run it (kernels/cpu/bf16_gemm.hpp's bf16_dot_available()), else f32.
CalibProducts default_calib_products();
// "auto" (the default), "f32" or "bf16"; throws qforge::Error for another name, and for bf16
// where the CPU cannot run it.
CalibProducts parse_calib_products(std::string_view name);

struct CalibrationOptions {
    std::vector<std::string> files;  // plain text, read whole, joined by a blank line
    uint64_t nsamples = 128;
    uint64_t seqlen = 512;  // capped at the model's context by the caller
    uint64_t seed = 42;
};

struct CalibrationSet {
    uint64_t nsamples = 0, seqlen = 0;
    std::vector<int32_t> tokens;     // [nsamples][seqlen]
    uint64_t text_tokens = 0;        // tokens in the whole text
    std::string tokens_hash;         // "xxh3-64:..." of the ids as little-endian int32
    nlohmann::json to_json() const;  // for the header: files, counts, seed, hash
    nlohmann::json recipe;           // options as given (file names without directories)
};

// Throws qforge::Error naming the file when a file cannot be read, and when the text has fewer
// tokens than one window needs ("calibration text too short").
CalibrationSet make_calibration_set(const Tokenizer& tokenizer, const CalibrationOptions& options);

}  // namespace qforge
