// What kind of model file a path holds, decided from its content: the one sniffing function
// that open_model_source (sources/model_source.cpp) dispatches on, so that the two never
// disagree about a file. Names only break ties where the content is ambiguous: a .bin whose
// llama2.c header is broken is still reported as a llama2.c checkpoint (with the header's
// error), a .safetensors whose header is broken as safetensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qforge {

enum class ModelFileKind : uint8_t {
    missing,       // nothing at the path
    hf_directory,  // a directory (a Hugging Face checkpoint, or not: its reader says)
    safetensors,   // 8-byte header length then '{' (or named *.safetensors)
    gguf,          // "GGUF"
    qf,            // "QFORGE\r\n" (formats/qf_format.hpp)
    llama2c,       // a legacy header that implies the file's length, "ak42", or named *.bin
    pytorch,       // a zip archive or a pickle: PyTorch's own checkpoint, not supported
    unknown,       // none of these
};

struct ModelFileProbe {
    ModelFileKind kind = ModelFileKind::unknown;
    uint64_t size = 0;          // of a regular file
    std::vector<uint8_t> head;  // its first bytes (at most 16), for the "unknown" message
};

// Never throws for a missing or unreadable path (kind missing / unknown).
ModelFileProbe detect_model_file(const std::string& path);

// "x.gguf: not a known model file: starts with bytes 47 47 55 46 ..., expected a GGUF ('GGUF'),
// .qf ('QFORGE'), safetensors or llama2.c checkpoint or a Hugging Face directory" and the like:
// the error for a probe whose kind is neither a convertible nor a loadable kind.
[[noreturn]] void throw_not_a_model_file(const std::string& path, const ModelFileProbe& probe);

}  // namespace qforge
