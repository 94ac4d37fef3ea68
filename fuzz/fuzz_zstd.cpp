// zstd tensor decoding (QfFile::tensor_bytes). The input: a u32 element count n, then the
// stored bytes of one zstd-encoded f32 tensor of shape [n]; the harness wraps them in a valid
// .qf, so every input reaches the frame checks and the decoder. The declared size is the
// fuzzer's, so a frame that claims far more than the header allows must be refused before
// anything that large is allocated.
#include "formats/qf.hpp"
#include "fuzz/fuzz_qf_common.hpp"
#include "fuzz/fuzz_support.hpp"

using namespace qforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::clear_scratch();
    fuzz::InputCursor in{{data, size}};
    const uint64_t elements = in.u32();
    const std::string_view stored = in.rest();
    const nlohmann::json header = {{"format", "qforge"},
                                   {"format_version", kQfVersion},
                                   {"model", nlohmann::json::object()},
                                   {"tokenizer", nullptr},
                                   {"provenance", nlohmann::json::object()},
                                   {"tensors",
                                    {{{"name", "t"},
                                      {"qtype", "f32"},
                                      {"shape", {elements}},
                                      {"offset", 0},
                                      {"length", elements * 4},
                                      {"stored_length", stored.size()},
                                      {"encoding", "zstd"},
                                      {"checksum", "xxh3-64:0000000000000000"}}}}};
    const std::string path = fuzz::write_file("zstd.qf", fuzz::assemble_qf(header.dump(), stored));
    fuzz::run_reader([&] {
        QfFile qf(path, QfOpenOptions{.check_model = false});  // a container with no model
        std::vector<uint8_t> scratch;
        const QfTensorInfo& t = qf.at("t");
        fuzz::run_reader([&] {
            std::span<const uint8_t> b = qf.tensor_bytes(t, scratch);
            if (b.size() != t.length) std::abort();
        });
        qf.verify_tensor(t, scratch);
    });
    return 0;
}
