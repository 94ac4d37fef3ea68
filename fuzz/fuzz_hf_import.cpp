// Hugging Face checkpoint import, float and GPTQ/AWQ: `convert DIR` on a directory holding
// config.json, model.safetensors and, when the third part is not empty, quantize_config.json
// (the parts of the input, in that order). Unpacking and repacking every quantized linear runs
// here; the .qf written must load again.
#include "convert/convert.hpp"
#include "fuzz/fuzz_exercise.hpp"
#include "fuzz/fuzz_support.hpp"

using namespace qforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::clear_scratch();
    const auto parts = fuzz::split_files(data, size, 3);
    fuzz::write_file("model/config.json", parts[0]);
    fuzz::write_file("model/model.safetensors", parts[1]);
    if (!parts[2].empty()) fuzz::write_file("model/quantize_config.json", parts[2]);
    fuzz::run_reader([&] {
        ConvertOptions o;
        o.input = (fuzz::scratch_dir() / "model").string();
        o.output = (fuzz::scratch_dir() / "out.qf").string();
        convert_checkpoint(o);
        fuzz::reopen_written_qf(o.output);
    });
    return 0;
}
