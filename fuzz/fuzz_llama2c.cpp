// llama2.c checkpoints: `convert model.bin` (header, layout, sizes, the RoPE row permutation).
// Parts: the checkpoint, then optionally a vocabulary written beside it as tokenizer.bin (the
// converter finds it there). The .qf it writes must load again.
#include "convert/convert.hpp"
#include "fuzz/fuzz_exercise.hpp"
#include "fuzz/fuzz_support.hpp"
#include "sources/llama2c.hpp"

using namespace qforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::clear_scratch();
    const auto parts = fuzz::split_files(data, size, 2);
    const std::string path = fuzz::write_file("model/model.bin", parts[0]);
    if (!parts[1].empty()) fuzz::write_file("model/tokenizer.bin", parts[1]);
    volatile bool detected = is_llama2c_checkpoint(path);
    (void)detected;
    fuzz::run_reader([&] {
        ConvertOptions o;
        o.input = path;
        o.output = (fuzz::scratch_dir() / "out.qf").string();
        convert_checkpoint(o);
        fuzz::reopen_written_qf(o.output);
    });
    return 0;
}
