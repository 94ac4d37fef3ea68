// tokenizer.json with tokenizer_config.json and generation_config.json beside it (the parts of
// the input, in that order; a part left empty is not written, so a plain tokenizer.json is read
// alone). The tokenizer built from it encodes, decodes and renders its chat template.
#include "fuzz/fuzz_exercise.hpp"
#include "fuzz/fuzz_support.hpp"

using namespace qforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::clear_scratch();
    const auto parts = fuzz::split_files(data, size, 3);
    const std::string path = fuzz::write_file("tokenizer.json", parts[0]);
    if (!parts[1].empty()) fuzz::write_file("tokenizer_config.json", parts[1]);
    if (!parts[2].empty()) fuzz::write_file("generation_config.json", parts[2]);
    fuzz::run_reader([&] { fuzz::exercise_tokenizer(Tokenizer::load(path)); });
    return 0;
}
