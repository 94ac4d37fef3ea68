// .qf -> a Hugging Face GPTQ (AutoGPTQ v1) or AWQ (GEMM) checkpoint directory that transformers
// and vLLM load: the exact inverse of sources/hf_quantized.hpp, which documents both layouts.
// Every quantized linear's codes, fp16 scales and integer zeros are repacked without
// re-quantizing, so importing the export gives back the same row bytes. A linear with a column
// permutation (an act-order import) is written to GPTQ with its g_idx (stored column j is input
// col_perm[j], in group j / group); AWQ and compressed-tensors refuse it by name.
//
// What each format can express (anything else is an Error naming the tensor and its type):
//   gptq: q4_g* (sym false), q4s_g* (sym true; zero 8 stored as 7), q8 / q8_g32 / q8_g128 (sym
//         true at 8 bits: our int8 code c becomes c + 128, zero 128 stored as 127). GPTQ v1
//         stores zero - 1 in `bits` bits, so an asymmetric 4-bit group whose zero is 0 (all its
//         weights >= 0, or all zero) cannot be written: refused by name. With gptq_v2 the
//         zeros are stored as they are (zero 8 as 8) and checkpoint_format says "gptq_v2".
//   awq:  q4_g* only (true zeros, no g_idx).
// One quantization_config holds one bits / group_size / sym, so every quantized linear of the
// blocks must share its type. Linears of the blocks kept float are listed in AWQ's
// modules_to_not_convert; GPTQ lists the quantized ones instead (modules_in_block_to_quantize,
// one list for all blocks, so every block must quantize the same linears). Outside the blocks
// (embeddings, lm_head) HF keeps float weights: a quantized embed or lm_head is written dequantized
// as F32, which is exact (a binary16 scale times a small integer), with a warning.
//
// Codes pack along k (GPTQ) or n (AWQ), zeros along n, so GPTQ needs k and n multiples of
// 32 / bits, AWQ n a multiple of 8; a linear that does not pack is refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sources/hf_quantized.hpp"

namespace qforge {

struct ExportOptions {
    std::string input;       // a quantized .qf
    std::string output_dir;  // the directory to create (must not exist, or be empty)
    HfQuantMethod format = HfQuantMethod::gptq;
    // gptq: write v2 (true zeros, checkpoint_format "gptq_v2", GPTQModel's layout) rather than
    // v1 (zero - 1, "gptq", what transformers, vLLM and AutoGPTQ read).
    bool gptq_v2 = false;
    // Above this many tensor bytes the weights are split into model-0000i-of-0000N.safetensors
    // shards with model.safetensors.index.json, as transformers' save_pretrained does.
    uint64_t max_shard_bytes = uint64_t{2} << 30;
};

struct ExportReport {
    uint64_t tensors = 0;            // tensors written (each quantized linear counts its parts)
    uint64_t bytes = 0;              // bytes of tensor data written
    std::vector<std::string> files;  // names of the files written, sorted
    std::string quant_type;          // the linears' qforge type
    std::vector<std::string> warnings;
};

// Checks output_dir first (core/output_path.hpp: new or empty, its parent exists, not the input),
// then writes the checkpoint into a hidden temporary directory beside it (core/atomic_file.hpp's
// AtomicDirectory) renamed into place only when everything is written; on any Error, SIGINT,
// SIGTERM or SIGHUP nothing is left behind.
ExportReport export_hf_quantized(const ExportOptions& options);

}  // namespace qforge
