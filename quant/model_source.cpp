#include "quant/model_source.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "convert/convert_common.hpp"
#include "convert/detect.hpp"
#include "convert/llama2c.hpp"
#include "core/alloc.hpp"
#include "core/error.hpp"
#include "formats/architectures.hpp"
#include "formats/qf.hpp"
#include "formats/safetensors.hpp"
#include "tokenizer/source.hpp"

namespace qforge {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class QfSource final : public ModelSource {
  public:
    explicit QfSource(const std::string& path) : qf_(path) {
        path_ = path;
        format_ = "qf";
        model_json_ = qf_.model();
        config_ = qf_.config();
        tokenizer_ = qf_.header().at("tokenizer");
        // Copied into the output as it is: a broken one must not pass on.
        if (!tokenizer_.is_null()) validate_tokenizer_schema(tokenizer_, path);
        input_provenance_ = qf_.header().at("provenance");
        sources_.push_back(source_entry(path));
        for (const auto& t : qf_.tensors()) tensors_.push_back({t.name, t.qtype, t.shape});
    }

    std::span<const uint8_t> bytes(size_t i, std::vector<uint8_t>& scratch) const override {
        // Checked: a quantized tensor is copied as stored, so a corrupt one must not pass.
        return qf_.tensor_bytes(qf_.tensors()[i], scratch, /*verify=*/true);
    }
    const std::string& file_of(size_t) const override { return path_; }
    void release(size_t i) const override { qf_.release(qf_.tensors()[i]); }

  private:
    QfFile qf_;
};

// A Hugging Face checkpoint, checked against the architecture table as `qforge convert` checks
// it: every expected tensor present with its shape and a float dtype, nothing unexpected.
class HfSource final : public ModelSource {
  public:
    HfSource(const std::string& path, const std::string& tokenizer) : ckpt_(path) {
        path_ = path;
        format_ = "safetensors";
        const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
        const std::string cfg_path = (dir / "config.json").string();
        if (!fs::exists(cfg_path))
            throw Error(
                path, {},
                "no config.json beside the checkpoint (needed for the model's architecture)");
        config_ = read_model_config(cfg_path);
        model_json_ = model_config_to_json(config_);
        check_tensors();

        ConvertReport report;  // collects the tokenizer file and warnings
        tokenizer_ = resolve_tokenizer(
            tokenizer, tokenizer.empty() ? find_tokenizer(path) : std::nullopt, path, config_,
            report);
        tokenizer_file_ = report.tokenizer;
        for (auto& w : report.warnings) warnings_.push_back(std::move(w));

        sources_.push_back(source_entry(cfg_path));
        for (const auto& f : ckpt_.files()) sources_.push_back(source_entry(f));
        if (!tokenizer_file_.empty()) sources_.push_back(source_entry(tokenizer_file_));
    }

    std::span<const uint8_t> bytes(size_t i, std::vector<uint8_t>&) const override {
        return ckpt_.tensor(hf_names_[i]).data;
    }
    const std::string& file_of(size_t i) const override { return ckpt_.file_of(hf_names_[i]); }
    void release(size_t i) const override { ckpt_.release(hf_names_[i]); }

  private:
    void check_tensors() {
        check_layers_fit(config_.num_layers, ckpt_.tensor_names().size(), path_,
                         "num_hidden_layers");
        const std::vector<TensorSpec> specs = expected_tensors(config_);
        std::map<std::string, const TensorSpec*> by_hf_name;
        for (const auto& s : specs) by_hf_name[s.hf_name] = &s;
        for (const std::string& name : ckpt_.tensor_names()) {
            if (by_hf_name.count(name) || is_ignorable_hf_tensor(name)) continue;
            if (name == "lm_head.weight" && config_.tie_word_embeddings) {
                warnings_.push_back(
                    "lm_head.weight ignored: config.json ties it to the embeddings");
                continue;
            }
            throw Error(ckpt_.file_of(name), name,
                        "unexpected tensor for architecture '" +
                            std::string(architecture_name(config_.arch)) +
                            "' (not in the architecture table)");
        }
        for (const auto& s : specs) {
            if (!ckpt_.contains(s.hf_name))
                throw Error(path_, s.hf_name,
                            "missing from the checkpoint (expected shape " +
                                shape_to_string(s.shape) + ")");
            const TensorView v = ckpt_.tensor(s.hf_name);
            if (v.shape != s.shape)
                throw Error(ckpt_.file_of(s.hf_name), s.hf_name,
                            "shape " + shape_to_string(v.shape) + " but config.json implies " +
                                shape_to_string(s.shape));
            const auto qt = qtype_from_dtype(v.dtype);
            if (!qt)
                throw Error(ckpt_.file_of(s.hf_name), s.hf_name,
                            "dtype " + std::string(dtype_info(v.dtype).safetensors_name) +
                                " is not a float type (expected F32, F16 or BF16)");
            tensors_.push_back({s.name, *qt, s.shape});
            hf_names_.push_back(s.hf_name);
        }
    }

    SafetensorsCheckpoint ckpt_;
    std::vector<std::string> hf_names_;  // parallel to tensors_
};

}  // namespace

std::unique_ptr<ModelSource> open_model_source(const std::string& input,
                                               const std::string& tokenizer) {
    const ModelFileProbe probe = detect_model_file(input);
    switch (probe.kind) {
        case ModelFileKind::qf:
            if (!tokenizer.empty())
                throw Error(input, {},
                            "--tokenizer applies to checkpoints; a .qf input keeps its own tokenizer");
            return naming_file_on_bad_alloc(input, [&] { return std::make_unique<QfSource>(input); });
        case ModelFileKind::gguf:
            throw Error(input, {},
                        "a GGUF file: convert it first (qforge convert), then quantize the .qf");
        case ModelFileKind::llama2c:
            throw Error(
                input, {},
                "a llama2.c checkpoint: convert it first (qforge convert), then quantize the .qf");
        case ModelFileKind::safetensors:
        case ModelFileKind::hf_directory:
            break;
        default:
            throw_not_a_model_file(input, probe);
    }
    return naming_file_on_bad_alloc(
        input, [&] { return std::make_unique<HfSource>(input, tokenizer); });
}

}  // namespace qforge
