// The calibration text reader (quant/calibration.cpp): a text file tokenized with a model's
// tokenizer and cut into seeded windows. The first input byte picks the tokenizer (one of the
// fixture families, loaded once) and the window length; the rest is the text file.
#include <memory>
#include <vector>

#include "fuzz/fuzz_support.hpp"
#include "quant/calibration.hpp"

using namespace qforge;

namespace {

const std::vector<Tokenizer>& tokenizers() {
    static const std::vector<Tokenizer> all = [] {
        std::vector<Tokenizer> t;
        for (const char* f :
             {"tokenizers/gpt2/tokenizer.json", "tokenizers/llama2/tokenizer.json",
              "tokenizers/llama3/tokenizer.json", "tokenizers/qwen2/tokenizer.json",
              "tokenizers/smollm2/tokenizer.json", "tokenizers/llama2-metaspace/tokenizer.json",
              "quant_checkpoints/tok512.bin"})
            t.push_back(Tokenizer::load(fuzz::fixture(f)));
        return t;
    }();
    return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::clear_scratch();
    fuzz::InputCursor in{{data, size}};
    const uint8_t control = in.u8();
    const Tokenizer& tok = tokenizers()[control % tokenizers().size()];
    CalibrationOptions o;
    o.files = {fuzz::write_file("calib.txt", in.rest())};
    if (control & 0x80) o.files.push_back(o.files[0]);  // two files, joined by a blank line
    o.nsamples = 2;
    o.seqlen = 2 + (control >> 4 & 7) * 4;
    fuzz::run_reader([&] {
        CalibrationSet s = make_calibration_set(tok, o);
        if (s.tokens.size() != s.nsamples * s.seqlen) std::abort();
        volatile size_t sink = s.to_json().dump().size();
        (void)sink;
    });
    return 0;
}
