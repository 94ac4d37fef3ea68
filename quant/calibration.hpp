// Calibration data for GPTQ and AWQ: plain text files tokenized with the model's own tokenizer,
// and `nsamples` windows of `seqlen` tokens drawn at seeded random positions (as GPTQ's and
// AutoGPTQ's loaders do), each starting with BOS when the model's tokenizer adds one. The
// recipe and an xxh3-64 hash of the chosen token ids go into the .qf header, so a quantization
// says exactly which data it saw.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.hpp"

namespace qforge {

struct CalibrationOptions {
    std::vector<std::string> files;  // plain text, read whole, joined by a blank line
    uint64_t nsamples = 128;
    uint64_t seqlen = 512;  // capped at the model's context by the caller
    uint64_t seed = 42;
};

struct CalibrationSet {
    uint64_t nsamples = 0, seqlen = 0;
    std::vector<int32_t> tokens;     // [nsamples][seqlen]
    uint64_t text_tokens = 0;        // tokens in the whole text
    std::string tokens_hash;         // "xxh3-64:..." of the ids as little-endian int32
    nlohmann::json to_json() const;  // for the header: files, counts, seed, hash
    nlohmann::json recipe;           // options as given (file names without directories)
};

// Throws qforge::Error naming the file when a file cannot be read, and when the text has fewer
// tokens than one window needs ("calibration text too short").
CalibrationSet make_calibration_set(const Tokenizer& tokenizer, const CalibrationOptions& options);

}  // namespace qforge
