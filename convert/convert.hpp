// Any model source (sources/model_source.hpp: a Hugging Face float or GPTQ/AWQ checkpoint, a GGUF
// file, a llama2.c checkpoint) -> .qf: source -> writer. Streams tensor by tensor: each tensor is
// read from the source, converted if asked, written and its pages released, so peak memory stays
// near the largest tensor, not the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/qtype.hpp"

namespace qforge {

struct ConvertOptions {
    std::string input;           // HF directory, .safetensors, llama2.c .bin or .gguf file
    std::string output;          // .qf path
    std::optional<QType> dtype;  // nullopt: keep each tensor's source precision (GGUF: f32)
    std::string tokenizer;       // empty: look for one beside the checkpoint
    bool compress = false;       // zstd tensor encoding
    bool keep_quant = false;     // GGUF: Q8_0/Q4_0 stay quantized (sources/gguf_keep_quant.hpp)
};

struct ConvertReport {
    std::string tokenizer;  // the tokenizer file used, empty when none
    uint64_t tensors = 0;
    uint64_t parameters = 0;
    uint64_t bytes_written = 0;
    std::vector<std::string> warnings;  // shown to the user; conversion still succeeded
};

class ModelSource;

// Writes an opened source to options.output (options.input, tokenizer and keep_quant were the
// source's to use).
ConvertReport convert_source(const ModelSource& src, const ConvertOptions& options);

// Converts any supported input, whichever kind its content says it is (sources/detect.hpp); a
// .qf is refused (nothing to convert).
ConvertReport convert_checkpoint(const ConvertOptions& options);

}  // namespace qforge
