// safetensors: one file (SafetensorsFile and SafetensorsCheckpoint on it), or, when the input
// holds file separators, a sharded checkpoint directory: model.safetensors.index.json, then the
// shards model-00001-of-00002.safetensors and model-00002-of-00002.safetensors.
#include <cstring>

#include "formats/safetensors.hpp"
#include "fuzz/fuzz_support.hpp"

using namespace qforge;

namespace {

// Touches every byte of every view, so a view that reaches past the mapping is an ASan report.
uint64_t checksum(std::span<const uint8_t> b) {
    uint64_t s = 0;
    for (uint8_t v : b) s = s * 31 + v;
    return s;
}

void read_checkpoint(const SafetensorsCheckpoint& ckpt) {
    volatile uint64_t sink = ckpt.total_tensor_bytes();
    for (const std::string& name : ckpt.tensor_names()) {
        if (!ckpt.contains(name)) std::abort();
        sink = sink + checksum(ckpt.tensor(name).data) + ckpt.file_of(name).size();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::clear_scratch();
    const auto parts = fuzz::split_files(data, size, 3);
    if (std::string_view(reinterpret_cast<const char*>(data), size).find(fuzz::kFileSeparator) ==
        std::string_view::npos) {
        const std::string path = fuzz::write_file("model.safetensors", parts[0]);
        fuzz::run_reader([&] {
            SafetensorsFile f(path);
            volatile uint64_t sink = f.data_offset() + f.metadata().size();
            for (const auto& t : f.tensors()) {
                if (f.find(t.name) != &t) std::abort();
                sink = sink + checksum(f.view(t).data);
            }
        });
        fuzz::run_reader([&] { read_checkpoint(SafetensorsCheckpoint(path)); });
        return 0;
    }
    fuzz::write_file("dir/model.safetensors.index.json", parts[0]);
    fuzz::write_file("dir/model-00001-of-00002.safetensors", parts[1]);
    fuzz::write_file("dir/model-00002-of-00002.safetensors", parts[2]);
    fuzz::run_reader(
        [&] { read_checkpoint(SafetensorsCheckpoint((fuzz::scratch_dir() / "dir").string())); });
    return 0;
}
