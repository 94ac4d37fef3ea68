#include "qf_support.hpp"

#include <xxhash.h>

#include <cstring>
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

}  // namespace qforge::test
