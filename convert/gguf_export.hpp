// .qf -> a GGUF file that llama.cpp loads: the exact inverse of `qforge convert --keep-quant`
// (sources/gguf.hpp, sources/gguf_keep_quant.hpp). Tensors keep their bits:
//   q8_g32 -> Q8_0, q4s_g32 -> Q4_0 (the same codes and fp16 scales per 32, repacked by
//   pack_gguf_rows), f32/f16/bf16 -> F32/F16/BF16; every other qtype is refused by name with
//   the nearest exportable type (quantize --qtype q4s_g32 --method gptq|awq gives GPTQ/AWQ
//   quality inside plain Q4_0 blocks).
// Names are llama.cpp's (the architecture table's gguf_pattern); for adjacent-pair-RoPE
// architectures ("llama") the q/k rows are reordered back to llama.cpp's layout, as its
// converter does. Metadata: general.*, the architecture's hyperparameters under "<arch>.", and
// the tokenizer as tokenizer.ggml.* (tokenizer/gguf_writer.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qforge {

struct GgufExportOptions {
    std::string input;   // a .qf
    std::string output;  // the .gguf to write (replaced atomically when it exists)
    std::string name;    // general.name; empty: the input's file name without extension
};

struct GgufExportReport {
    uint64_t tensors = 0;
    uint64_t bytes = 0;                          // the file's size
    std::string file_type;                       // general.file_type's name: "MOSTLY_Q4_0", ...
    std::map<std::string, uint64_t> ggml_types;  // tensors per ggml type name
    std::vector<std::string> warnings;
};

// Checks the output path first (core/output_path.hpp: not an input, not a device, its
// directory exists), then writes through GgufWriter (nothing appears until it is complete).
GgufExportReport export_gguf(const GgufExportOptions& options);

}  // namespace qforge
