// GGUF model (llama.cpp's format) as a ModelSource (sources/model_source.hpp): the model config
// from the metadata, every tensor dequantized to float and renamed from llama.cpp's names to
// ours, and the tokenizer from the metadata (tokenizer/source_gguf.hpp).
//
// llama.cpp's names (blk.N.attn_q.weight, token_embd.weight, ...) map to ours through the
// architecture table (formats/architectures.hpp), which also says whose rows RoPE reorders. For
// the "llama" architecture llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute)
// reorders the rows of q and k from Hugging Face's rotate-half RoPE to adjacent-pair RoPE
// (llama.cpp's LLAMA_ROPE_TYPE_NORM); the source reorders them back (permute_rope_pairs_to_halves,
// the same reordering as llama2.c checkpoints need), so the stored model is the Hugging Face one.
// "qwen2" files keep Hugging Face's order (LLAMA_ROPE_TYPE_NEOX) and are not reordered.
//
// Quantized GGUF weights are dequantized exactly (formats/gguf_dequant.hpp); the result is
// stored as f32 by default, or as --dtype asks (matrices only: 1-D tensors stay f32). The .qf
// is then the "float" model that the GGUF's quantized weights represent. With --keep-quant, Q8_0
// and Q4_0 matrices instead keep their codes as q8_g32 / q4s_g32 rows, losslessly, and F16/BF16
// tensors their bits (sources/gguf_keep_quant.hpp); `qforge export --format gguf`
// (convert/gguf_export.hpp) is its inverse.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "formats/gguf.hpp"
#include "formats/model_config.hpp"

namespace qforge {

// GGUF architectures qforge reads and writes. `adjacent_pair_rope`: llama.cpp rotates adjacent
// pairs for this architecture (LLAMA_ROPE_TYPE_NORM), so its converter permuted q and k: import
// undoes it, export re-applies it.
struct GgufArchitecture {
    std::string_view name;  // general.architecture
    Architecture arch;
    bool adjacent_pair_rope;
};
std::span<const GgufArchitecture> gguf_architectures();
// The row of one of our architectures; nullptr when GGUF has none qforge reads back.
const GgufArchitecture* gguf_architecture_of(Architecture arch);

// Whether `path` is a GGUF file: a regular file starting with the magic "GGUF". Never throws.
bool is_gguf_file(const std::string& path);

// The model config the metadata describes (general.architecture and its keys); throws an Error
// naming the file and the key for an unsupported architecture or a value qforge cannot run.
ModelConfig gguf_model_config(const GgufFile& file);

// For Gemma, the values llama.cpp hard-codes instead of reading them from a GGUF (the window
// pattern, the local RoPE base, the query scale, gemma3's missing attention soft-capping) must
// be this config's for a GGUF to describe it: the first that differs, in words; "" when none
// differs or the architecture is not Gemma.
std::string gguf_gemma_mismatch(const ModelConfig& c);

}  // namespace qforge
