// Test helpers that write .qf files with exactly one defect: the header text and a header
// replaced with the preamble kept consistent, the smallest valid llama config, and zero tensors
// for every tensor that config expects; models with random weights. Part of qforge_test_support
// (formats and core only).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "formats/model_config.hpp"
#include "formats/qf.hpp"

namespace qforge::test {

// A .qf's JSON header text, and the header replaced by `text` with the preamble's length and
// checksum kept consistent, so that a test breaks exactly what it means to and the reader gets
// past every check before the header's content.
std::string qf_header_text(const std::filesystem::path& qf);
void replace_qf_header(const std::filesystem::path& qf, const std::string& text);

// The smallest llama config the architecture table accepts around a given vocabulary and hidden
// size (one layer, one head of dimension 2, intermediate 8), and its expected tensors in f32
// zeros (every one but `skip`) added to a writer: for files that must be valid models except for
// the one defect a test puts in.
ModelConfig tiny_llama_config(uint64_t vocab_size, uint64_t hidden_size);
void add_zero_tensors(QfWriter& writer, const ModelConfig& config, const std::string& skip = {});

// How write_random_model spreads a matrix's values.
enum class WeightSpread {
    // As a trained model's: normal with sd 1/sqrt(cols), the embedding 4x that.
    trained,
    // Each 32-block its own magnitude (10^-2 .. 1 times 1/sqrt(cols)) and offset, one block in
    // seven all zero: groups get varied scales and zero points, and all-zero groups occur.
    blocky,
};

// A .qf of `config` with random weights from `seed`: every matrix in `qtype` (through the
// reference quantizer), or in qtype_of(tensor name) when given (mixed recipes), every vector
// (norms near 1, biases near 0) in f32.
void write_random_model(const std::filesystem::path& path, const ModelConfig& config, QType qtype,
                        uint32_t seed, WeightSpread spread,
                        const std::function<QType(const std::string&)>& qtype_of = {});

}  // namespace qforge::test
