// Where every command reads a model from: one ModelSource per input kind, chosen by content
// (sources/detect.hpp: magic bytes, the llama2.c header's implied size, a directory) in
// open_model_source, the one dispatch:
//
//   .qf                 QfSource       (sources/qf_source.cpp)   tensors as stored, verified
//   Hugging Face        HfSource       (sources/hf_source.cpp)   a directory or one .safetensors
//                                                                file with config.json beside it;
//                                                                float tensors as stored, GPTQ/AWQ
//                                                                linears repacked into our rows
//   GGUF                GgufSource     (sources/gguf.cpp)        dequantized to f32 (or, with
//                                                                keep_quant, Q8_0/Q4_0 as rows)
//   llama2.c .bin       Llama2cSource  (sources/llama2c.cpp)     f32
//
// Each source is checked against the architecture table (formats/architectures.hpp) once, when
// it is opened: every expected tensor present with its shape and a readable type, nothing
// unexpected. It then gives the model config, the tokenizer schema, the provenance of its input
// files and the tensors in canonical order under our names, in the Hugging Face layout (the RoPE
// row order of q and k undone where the input permuted it), each readable and releasable on its
// own, so `convert` (source -> writer) and `quantize` (source -> recipe -> writer) stream a model
// larger than memory tensor by tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "formats/model_config.hpp"
#include "formats/qtype.hpp"

namespace qforge {

struct SourceTensor {
    std::string name;  // our name ("layers.3.attn.q")
    QType qtype;       // as bytes() returns it
    std::vector<uint64_t> shape;
    // A quantized matrix's column permutation (QfTensorInfo::col_perm: an act-order GPTQ
    // import), written with it; empty for every other tensor.
    std::vector<uint32_t> col_perm = {};
};

class ModelSource {
  public:
    virtual ~ModelSource() = default;

    const std::string& path() const { return path_; }
    // "qf", "safetensors", "gguf" or "llama2c": quantize's provenance records it.
    std::string_view format() const { return format_; }
    const ModelConfig& config() const { return config_; }
    const nlohmann::json& model_json() const { return model_json_; }
    const nlohmann::json& tokenizer() const { return tokenizer_; }         // null: none
    const std::string& tokenizer_file() const { return tokenizer_file_; }  // empty: from the .qf
    // Provenance entries (core/hash: name, bytes, xxh3-128) of every input file.
    const nlohmann::json& sources() const { return sources_; }
    // The input's own provenance (a .qf's "provenance" object); null for checkpoints.
    const nlohmann::json& input_provenance() const { return input_provenance_; }
    // What `convert` adds to its recipe record about the input ({"source_format": "gguf", ...}).
    const nlohmann::json& recipe_extra() const { return recipe_extra_; }
    // The stored type `convert` uses when no --dtype is given: nullopt keeps each tensor's type
    // (GGUF's f32: its dequantized weights are no source precision of their own).
    const std::optional<QType>& default_dtype() const { return default_dtype_; }
    const std::vector<SourceTensor>& tensors() const { return tensors_; }
    const std::vector<std::string>& warnings() const { return warnings_; }

    // The bytes of tensor i as tensors()[i] describes them (a view into the mapping, or
    // `scratch` when decoded, dequantized or reordered).
    virtual std::span<const uint8_t> bytes(size_t i, std::vector<uint8_t>& scratch) const = 0;
    // The file that holds tensor i (for error messages).
    virtual const std::string& file_of(size_t i) const = 0;
    // Drops tensor i's pages from this process.
    virtual void release(size_t i) const = 0;
    // Tensor i as error messages name it: our name, or the input's ("layers.0.attn.q (GGUF
    // blk.0.attn_q.weight, Q8_0)"), whichever the user can find in the file.
    virtual std::string label(size_t i) const { return tensors_[i].name; }
    // Bytes tensor i occupies in the input, for progress.
    virtual uint64_t source_bytes(size_t i) const {
        return qtype_tensor_bytes(tensors_[i].qtype, tensors_[i].shape).value_or(0);
    }

  protected:
    std::string path_;
    std::string_view format_;
    ModelConfig config_;
    nlohmann::json model_json_;
    nlohmann::json tokenizer_;
    std::string tokenizer_file_;
    nlohmann::json sources_ = nlohmann::json::array();
    nlohmann::json input_provenance_;
    nlohmann::json recipe_extra_ = nlohmann::json::object();
    std::optional<QType> default_dtype_;
    std::vector<SourceTensor> tensors_;
    std::vector<std::string> warnings_;
};

struct SourceOptions {
    // A checkpoint's tokenizer file to embed (empty: the one found beside it, or a GGUF's own);
    // refused for a .qf, which keeps its own.
    std::string tokenizer;
    // GGUF: Q8_0 and Q4_0 matrices as q8_g32 / q4s_g32 rows instead of f32 (gguf_keep_quant.hpp).
    bool keep_quant = false;
};

// Opens `input`, whichever kind its content says it is; an Error naming the file otherwise.
std::unique_ptr<ModelSource> open_model_source(const std::string& input,
                                               const SourceOptions& options);
std::unique_ptr<ModelSource> open_model_source(const std::string& input,
                                               const std::string& tokenizer);

}  // namespace qforge
