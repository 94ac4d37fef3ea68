#include "sources/detect.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "formats/gguf.hpp"
#include "formats/qf_format.hpp"
#include "sources/llama2c.hpp"

namespace qforge {

namespace fs = std::filesystem;

namespace {

constexpr size_t kHeadBytes = 16;

bool starts_with(const std::vector<uint8_t>& head, const void* magic, size_t n) {
    return head.size() >= n && std::memcmp(head.data(), magic, n) == 0;
}

// safetensors: a little-endian u64 header length that fits the file, then a JSON object.
bool looks_like_safetensors(const std::vector<uint8_t>& head, uint64_t size) {
    if (head.size() < 9 || size < 10) return false;
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = len << 8 | head[static_cast<size_t>(i)];
    return len >= 2 && len <= size - 8 && head[8] == '{';
}

bool looks_like_pytorch(const std::vector<uint8_t>& head) {
    return starts_with(head, "PK\x03\x04", 4) ||
           (head.size() >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5);
}

std::string hex_bytes(const std::vector<uint8_t>& head) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string s;
    for (uint8_t b : head) {
        if (!s.empty()) s += ' ';
        s += kHex[b >> 4];
        s += kHex[b & 15];
    }
    return s;
}

}  // namespace

ModelFileProbe detect_model_file(const std::string& path) {
    ModelFileProbe probe;
    std::error_code ec;
    const auto status = fs::status(path, ec);
    if (ec || !fs::exists(status)) {
        probe.kind = ModelFileKind::missing;
        return probe;
    }
    if (fs::is_directory(status)) {
        probe.kind = ModelFileKind::hf_directory;
        return probe;
    }
    if (!fs::is_regular_file(status)) return probe;  // a device or FIFO is no model
    probe.size = fs::file_size(path, ec);
    if (ec) return probe;
    std::ifstream in(path, std::ios::binary);
    probe.head.resize(kHeadBytes);
    in.read(reinterpret_cast<char*>(probe.head.data()), kHeadBytes);
    probe.head.resize(static_cast<size_t>(in.gcount()));
    const std::vector<uint8_t>& h = probe.head;
    const std::string ext = fs::path(path).extension().string();
    uint32_t magic32 = 0;
    if (h.size() >= 4) std::memcpy(&magic32, h.data(), 4);
    if (starts_with(h, kGgufMagic, 4))
        probe.kind = ModelFileKind::gguf;
    else if (starts_with(h, kQfMagic, sizeof kQfMagic))
        probe.kind = ModelFileKind::qf;
    else if (h.size() >= 4 && magic32 == kLlama2cMagic)
        probe.kind = ModelFileKind::llama2c;
    else if (looks_like_safetensors(h, probe.size) || ext == ".safetensors")
        probe.kind = ModelFileKind::safetensors;
    else if (llama2c_header_implies_size(path, probe.size))
        probe.kind = ModelFileKind::llama2c;
    else if (ext == ".bin")
        probe.kind = ModelFileKind::llama2c;  // its header's own error is the clearest
    else if (looks_like_pytorch(h))
        probe.kind = ModelFileKind::pytorch;
    return probe;
}

void throw_not_a_model_file(const std::string& path, const ModelFileProbe& probe) {
    const std::string expected =
        "expected a GGUF ('GGUF'), .qf ('QFORGE'), safetensors or llama2.c checkpoint, or a "
        "Hugging Face checkpoint directory";
    switch (probe.kind) {
        case ModelFileKind::missing:
            throw Error(path, {}, "no such file or directory");
        case ModelFileKind::pytorch:
            throw Error(path, {},
                        "a PyTorch checkpoint (zip or pickle), which is not supported: convert "
                        "the model's safetensors instead");
        default:
            break;
    }
    std::error_code ec;
    if (fs::exists(path, ec) && !fs::is_regular_file(path, ec) && !fs::is_directory(path, ec))
        throw Error(path, {}, "not a regular file; " + expected);
    if (probe.head.empty())
        throw Error(path, {}, "not a known model file: it is empty (0 bytes); " + expected);
    std::string detail = "not a known model file: starts with bytes " + hex_bytes(probe.head) +
                         (probe.size > probe.head.size() ? " ..." : "") + ", " + expected;
    const std::string ext = fs::path(path).extension().string();
    if (ext == ".gguf")
        detail += " (the name ends in .gguf but the file does not start with 'GGUF')";
    if (ext == ".qf") detail += " (the name ends in .qf but the file does not start with 'QFORGE')";
    throw Error(path, {}, detail);
}

}  // namespace qforge
