// Where `qforge quantize` reads a model from: a .qf file, or a Hugging Face checkpoint (a
// directory or one .safetensors file with config.json beside it) read the way `qforge convert`
// reads it. Both give the same thing: the model config, the tokenizer schema, the provenance of
// the inputs, and the tensors in canonical order (formats/architectures.hpp), each readable and
// releasable on its own, so the pipeline streams a model larger than memory tensor by tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "formats/model_config.hpp"
#include "formats/qtype.hpp"

namespace qforge {

struct SourceTensor {
    std::string name;  // our name ("layers.3.attn.q")
    QType qtype;       // as stored in the input
    std::vector<uint64_t> shape;
};

class ModelSource {
  public:
    virtual ~ModelSource() = default;

    const std::string& path() const { return path_; }
    std::string_view format() const { return format_; }  // "qf" or "safetensors"
    const ModelConfig& config() const { return config_; }
    const nlohmann::json& model_json() const { return model_json_; }
    const nlohmann::json& tokenizer() const { return tokenizer_; }         // null: none
    const std::string& tokenizer_file() const { return tokenizer_file_; }  // empty: from the .qf
    // Provenance entries (core/hash: name, bytes, xxh3-128) of every input file.
    const nlohmann::json& sources() const { return sources_; }
    // The input's own provenance (a .qf's "provenance" object); null for checkpoints.
    const nlohmann::json& input_provenance() const { return input_provenance_; }
    const std::vector<SourceTensor>& tensors() const { return tensors_; }
    const std::vector<std::string>& warnings() const { return warnings_; }

    // The stored bytes of tensor i (a view into the mapping, or `scratch` when decoded).
    virtual std::span<const uint8_t> bytes(size_t i, std::vector<uint8_t>& scratch) const = 0;
    // The file that holds tensor i (for error messages).
    virtual const std::string& file_of(size_t i) const = 0;
    // Drops tensor i's pages from this process.
    virtual void release(size_t i) const = 0;

  protected:
    std::string path_;
    std::string_view format_;
    ModelConfig config_;
    nlohmann::json model_json_;
    nlohmann::json tokenizer_;
    std::string tokenizer_file_;
    nlohmann::json sources_ = nlohmann::json::array();
    nlohmann::json input_provenance_;
    std::vector<SourceTensor> tensors_;
    std::vector<std::string> warnings_;
};

// Opens `input`: a .qf file (by its magic), else a Hugging Face checkpoint. `tokenizer`: for a
// checkpoint, the tokenizer file to embed (empty: the one found beside it); a .qf keeps its own.
std::unique_ptr<ModelSource> open_model_source(const std::string& input,
                                               const std::string& tokenizer);

}  // namespace qforge
