#include "qf_support.hpp"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "formats/architectures.hpp"
#include "formats/qf_format.hpp"
#include "test_support.hpp"

namespace qforge::test {

namespace fs = std::filesystem;

std::string qf_header_text(const fs::path& qf) {
    const auto bytes = read_file(qf);
    QfPreamble pre;
    if (bytes.size() < sizeof pre) throw std::runtime_error(qf.string() + ": no .qf preamble");
    std::memcpy(&pre, bytes.data(), sizeof pre);
    return std::string(bytes.begin() + static_cast<long>(pre.header_offset), bytes.end());
}

void replace_qf_header(const fs::path& qf, const std::string& text) {
    auto bytes = read_file(qf);
    QfPreamble pre;
    if (bytes.size() < sizeof pre) throw std::runtime_error(qf.string() + ": no .qf preamble");
    std::memcpy(&pre, bytes.data(), sizeof pre);
    bytes.resize(pre.header_offset);
    bytes.insert(bytes.end(), text.begin(), text.end());
    pre.header_length = text.size();
    pre.header_checksum = XXH3_64bits(text.data(), text.size());
    std::memcpy(bytes.data(), &pre, sizeof pre);
    write_file(qf, bytes);
}

ModelConfig tiny_llama_config(uint64_t vocab_size, uint64_t hidden_size) {
    ModelConfig c;
    c.arch = Architecture::llama;
    c.vocab_size = vocab_size;
    c.hidden_size = hidden_size;
    c.intermediate_size = 8;
    c.num_layers = 1;
    c.num_heads = 1;
    c.num_kv_heads = 1;
    c.head_dim = 2;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    c.tie_word_embeddings = true;
    c.torch_dtype = "float32";
    return c;
}

void add_zero_tensors(QfWriter& writer, const ModelConfig& config, const std::string& skip) {
    for (const TensorSpec& spec : expected_tensors(config)) {
        if (spec.name == skip) continue;
        uint64_t bytes = 4;
        for (uint64_t d : spec.shape) bytes *= d;
        writer.add_tensor(spec.name, QType::f32, spec.shape, std::vector<uint8_t>(bytes, 0));
    }
}

namespace {

void fill_matrix(std::vector<float>& v, const TensorSpec& spec, WeightSpread spread,
                 std::mt19937& rng) {
    const uint64_t rows = spec.shape[0], cols = spec.shape[1];
    const float unit = 1.0f / std::sqrt(static_cast<float>(cols));
    if (spread == WeightSpread::trained) {
        std::normal_distribution<float> dist(0.0f, unit);
        for (auto& x : v) x = dist(rng);
        if (spec.name == "embed")
            for (auto& x : v) x *= 4.0f;
        return;
    }
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> exponent(-2.0f, 0.0f);
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t j = 0; j < cols; j += 32) {
            const float scale = unit * std::pow(10.0f, exponent(rng)), offset = scale * normal(rng);
            const bool zero = (r * 131 + j / 32) % 7 == 3;
            for (uint64_t i = j; i < std::min(cols, j + 32); ++i)
                v[r * cols + i] = zero ? 0.0f : offset + scale * normal(rng);
        }
}

}  // namespace

void write_random_model(const fs::path& path, const ModelConfig& config, QType qtype, uint32_t seed,
                        WeightSpread spread,
                        const std::function<QType(const std::string&)>& qtype_of) {
    std::mt19937 rng(seed);
    QfWriter w(path.string());
    w.set_model(model_config_to_json(config));
    for (const TensorSpec& spec : expected_tensors(config)) {
        uint64_t n = 1;
        for (uint64_t d : spec.shape) n *= d;
        std::vector<float> v(n);
        if (spec.is_matrix) {
            fill_matrix(v, spec, spread, rng);
            const QType t = qtype_of ? qtype_of(spec.name) : qtype;
            w.add_tensor(spec.name, t, spec.shape,
                         matrix_bytes(t, spec.shape[0], spec.shape[1], v));
            continue;
        }
        const bool bias = spec.name.find("bias") != std::string::npos;
        std::normal_distribution<float> dist(bias ? 0.0f : 1.0f, bias ? 0.5f : 0.1f);
        for (auto& x : v) x = dist(rng);
        w.add_tensor(spec.name, QType::f32, spec.shape, float_bytes(QType::f32, v));
    }
    w.finish();
}

}  // namespace qforge::test
