// Hugging Face checkpoint (a directory or one .safetensors file, with config.json) -> .qf.
// Streams tensor by tensor: each tensor is read from the mapping, converted if asked, written and
// its pages released, so peak memory stays near the largest tensor, not the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/qtype.hpp"

namespace qforge {

struct ConvertOptions {
    std::string input;               // HF directory, .safetensors, llama2.c .bin or .gguf file
    std::string output;              // .qf path
    std::optional<QType> dtype;      // nullopt: keep each tensor's source precision (GGUF: f32)
    std::string tokenizer;           // empty: look for one beside the checkpoint
    bool compress = false;           // zstd tensor encoding
    bool keep_quant = false;         // GGUF: Q8_0/Q4_0 stay quantized (convert/gguf_keep_quant.hpp)
};

struct ConvertReport {
    std::string tokenizer;              // the tokenizer file used, empty when none
    uint64_t tensors = 0;
    uint64_t parameters = 0;
    uint64_t bytes_written = 0;
    std::vector<std::string> warnings;  // shown to the user; conversion still succeeded
};

ConvertReport convert_hf_checkpoint(const ConvertOptions& options);

// Converts any supported input: a GGUF file (convert/gguf.hpp), a llama2.c checkpoint
// (convert/llama2c.hpp decides) or else a Hugging Face checkpoint.
ConvertReport convert_checkpoint(const ConvertOptions& options);

}  // namespace qforge
