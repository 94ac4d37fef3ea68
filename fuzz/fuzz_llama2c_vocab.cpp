// A llama2.c vocabulary (tokenizer.bin: max token length, then per token a float score, an
// int32 length and the bytes), loaded as `--tokenizer tok512.bin` is, then used.
#include "fuzz/fuzz_exercise.hpp"
#include "fuzz/fuzz_support.hpp"

using namespace qforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::clear_scratch();
    const std::string path =
        fuzz::write_file("tokenizer.bin", {reinterpret_cast<const char*>(data), size});
    fuzz::run_reader([&] { fuzz::exercise_tokenizer(Tokenizer::load(path)); });
    return 0;
}
