// The .qf header and tensor table. The input is the header's JSON, a file separator, then the
// data section; the harness writes the preamble around them (fuzz_qf_common.hpp). An input that
// starts with the .qf magic is taken as a whole file instead (the preamble's own checks).
// The file is opened as every command opens it: the model config, the tokenizer, each tensor's
// bytes (zstd tensors decoded) and the checksums.
#include "formats/qf_validate.hpp"
#include "fuzz/fuzz_exercise.hpp"
#include "fuzz/fuzz_qf_common.hpp"
#include "fuzz/fuzz_support.hpp"

using namespace qforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::clear_scratch();
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    std::string file;
    if (input.starts_with(std::string_view(kQfMagic, sizeof kQfMagic))) {
        file = input;
    } else {
        const auto parts = fuzz::split_files(data, size, 2);
        file = fuzz::assemble_qf(parts[0], parts[1]);
    }
    const std::string path = fuzz::write_file("model.qf", file);
    // The container alone (as inspect reads it), then as every command opens it: the model
    // validated against its config and the architecture table.
    fuzz::run_reader([&] {
        QfFile qf(path, QfOpenOptions{.check_model = false});
        volatile uint64_t sink = qf.version() + qf.file_size() + qf.header().size();
        fuzz::run_reader(
            [&] { sink = sink + model_config_from_json(qf.model(), path).vocab_size; });
        std::vector<uint8_t> scratch;
        for (const QfTensorInfo& t : qf.tensors()) {
            if (qf.find(t.name) != &t || &qf.at(t.name) != &t) std::abort();
            sink = sink + qf_tensor_to_json(t).dump().size();
            fuzz::run_reader([&] {
                std::span<const uint8_t> b = qf.tensor_bytes(t, scratch);
                if (b.size() != t.length) std::abort();
                for (uint8_t v : b) sink = sink + v;
            });
            fuzz::run_reader([&] { qf.verify_tensor(t, scratch); });
        }
    });
    fuzz::run_reader([&] {
        QfFile qf(path);
        volatile uint64_t sink = qf.config().vocab_size;
        std::vector<uint8_t> scratch;
        for (const QfTensorInfo& t : qf.tensors())
            fuzz::run_reader(
                [&] { sink = sink + find_non_finite(t, qf.tensor_bytes(t, scratch)).has_value(); });
    });
    fuzz::run_reader([&] { fuzz::exercise_tokenizer(Tokenizer::load(path)); });
    return 0;
}
