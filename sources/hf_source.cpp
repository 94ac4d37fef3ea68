// A Hugging Face checkpoint as a source: a directory (or one .safetensors file) with config.json
// beside it. Float tensors are given as stored (F32, F16 or BF16). In a GPTQ/AWQ checkpoint
// (config.json's quantization_config, or quantize_config.json / quant_config.json beside it) the
// linears whose X.qweight is present are repacked into our rows without re-quantizing
// (sources/hf_quantized.hpp); the rest (embeddings, norms, lm_head, modules_to_not_convert) are
// float tensors as usual. Gemma's norm weights w, which transformers applies as (1 + w), are
// given as the float32 multiplier 1 + w (formats/model_config.hpp, ArchitectureFeatures).
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.hpp"
#include "formats/architectures.hpp"
#include "formats/safetensors.hpp"
#include "sources/compressed_tensors.hpp"
#include "sources/hf_quantized.hpp"
#include "sources/source_common.hpp"
#include "sources/source_kinds.hpp"
#include "tokenizer/source.hpp"

namespace qforge {

namespace {

namespace fs = std::filesystem;

std::string config_path_for(const std::string& input) {
    const fs::path p(input);
    const fs::path dir = fs::is_directory(p) ? p : p.parent_path();
    const fs::path cfg = dir / "config.json";
    if (!fs::exists(cfg))
        throw Error(input, {},
                    "no config.json " + std::string(fs::is_directory(p) ? "in" : "beside") +
                        " the checkpoint (needed for the model's architecture)");
    return cfg.string();
}

class HfSource final : public ModelSource {
  public:
    HfSource(const std::string& path, const std::string& cfg_path, const ModelConfig& config,
             const SourceOptions& options)
        : ckpt_(path), quant_(read_hf_quant_config(cfg_path)) {
        path_ = path;
        format_ = "safetensors";
        config_ = config;
        model_json_ = model_config_to_json(config_);
        if (quant_) {
            if (auto w = resolve_gptq_zeros(*quant_, ckpt_)) warnings_.push_back(*w);
            quant_target_ = hf_quant_target(*quant_);
            if (quant_->method == HfQuantMethod::compressed_tensors)
                quant_target_ = compressed_tensors_target(*quant_, quant_target_, ckpt_);
            recipe_extra_ = {{"source_format", hf_quant_method_name(quant_->method)},
                             {"source_quantization", quant_->declared},
                             {"imported_qtype", qtype_traits(quant_target_).name}};
        }
        check_names(cfg_path);
        check_tensors();
        tokenizer_ = resolve_tokenizer(
            options.tokenizer, options.tokenizer.empty() ? find_tokenizer(path) : std::nullopt,
            path, config_, tokenizer_file_, warnings_);
        sources_.push_back(source_entry(cfg_path));
        for (const auto& f : ckpt_.files()) sources_.push_back(source_entry(f));
        if (!tokenizer_file_.empty()) sources_.push_back(source_entry(tokenizer_file_));
    }

    std::span<const uint8_t> bytes(size_t i, std::vector<uint8_t>& scratch) const override {
        if (plus_one_[i]) return norm_plus_one(i, scratch);
        if (!imported_[i]) return slice_of(i, ckpt_.tensor(hf_names_[i]).data);
        const SourceTensor& t = tensors_[i];
        import_hf_quantized_linear(*quant_, quant_target_, ckpt_, hf_names_[i], t.shape[0],
                                   t.shape[1], scratch);
        return scratch;
    }
    const std::string& file_of(size_t i) const override {
        return ckpt_.file_of(imported_[i] ? hf_qweight_name(hf_names_[i], quant_->method)
                                          : hf_names_[i]);
    }
    void release(size_t i) const override {
        // A fused tensor is released with its last part (the others read it before).
        const Slice& s = slices_[i];
        if (!imported_[i] && s.row0 + tensors_[i].shape[0] == s.of) ckpt_.release(hf_names_[i]);
    }
    std::string label(size_t i) const override { return hf_names_[i]; }
    uint64_t source_bytes(size_t i) const override {
        const auto* t =
            ckpt_.find(imported_[i] ? hf_qweight_name(hf_names_[i], quant_->method) : hf_names_[i]);
        return (t->end - t->begin) / slices_[i].of * tensors_[i].shape[0];
    }

  private:
    // Every tensor of the checkpoint is one the architecture table expects, a part of a GPTQ/AWQ
    // linear it expects, or one the model does not use.
    void check_names(const std::string& cfg_path) {
        check_layers_fit(config_.num_layers, ckpt_.tensor_names().size(), cfg_path,
                         "num_hidden_layers");
        specs_ = expected_tensors(config_);
        std::map<std::string, const TensorSpec*> by_hf_name;
        for (const auto& s : specs_) by_hf_name[s.hf_name] = &s;
        for (const std::string& name : ckpt_.tensor_names()) {
            if (by_hf_name.count(name) || is_ignorable_hf_tensor(name)) continue;
            if (const auto weight = hf_quantized_part_of(name);
                weight && by_hf_name.count(*weight)) {
                if (!quant_)
                    throw Error(ckpt_.file_of(name), name,
                                "a GPTQ/AWQ tensor, but " + cfg_path +
                                    " declares no quantization_config (and there is no "
                                    "quantize_config.json or quant_config.json beside it)");
                continue;
            }
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
    }

    // Every expected tensor present, with the shape config.json implies and a float dtype (or
    // as the parts of a quantized linear, which the import checks).
    void check_tensors() {
        for (const auto& s : specs_) {
            if (s.fused_rows) {
                add_part(s);
                continue;
            }
            const std::string qweight = quant_ ? hf_qweight_name(s.hf_name, quant_->method) : "";
            if (quant_ && s.shape.size() == 2 && !qweight.empty() && ckpt_.contains(qweight)) {
                if (ckpt_.contains(s.hf_name))
                    throw Error(ckpt_.file_of(s.hf_name), s.hf_name,
                                "both a float weight and " + qweight + " are present");
                add(s, quant_target_, true);
                tensors_.back().col_perm =
                    hf_quantized_col_perm(*quant_, ckpt_, s.hf_name, s.shape[0], s.shape[1]);
                continue;
            }
            add(s, float_tensor(s.hf_name, s.shape, ""), false);
        }
    }

    // A tensor stored as rows of a fused one (Phi-3's qkv_proj, gate_up_proj): the fused
    // tensor must have the rows of all its parts, config.json's width and a float dtype; the
    // part is a slice of its bytes, so nothing is copied or re-rounded.
    void add_part(const TensorSpec& s) {
        if (quant_)
            throw Error(path_, s.hf_name,
                        "GPTQ/AWQ checkpoints of " + std::string(architecture_name(config_.arch)) +
                            " (fused q/k/v and gate/up projections) are not supported; convert "
                            "the float checkpoint and quantize it with qforge");
        const std::vector<uint64_t> fused = {s.fused_rows, s.shape[1]};
        const QType qt =
            float_tensor(s.hf_name, fused, " (the fused rows of " + s.name + " and its siblings)");
        add(s, qt, false);
        slices_.back() = {s.fused_row0, s.fused_rows};
    }

    // The float tensor `name`: present, of the shape config.json implies (`note` says what that
    // shape is made of, if not plainly the tensor's) and of a float dtype, which it returns.
    QType float_tensor(const std::string& name, const std::vector<uint64_t>& shape,
                       const std::string& note) const {
        if (!ckpt_.contains(name))
            throw Error(
                path_, name,
                "missing from the checkpoint (expected shape " + shape_to_string(shape) + ")");
        const TensorView v = ckpt_.tensor(name);
        if (v.shape != shape)
            throw Error(ckpt_.file_of(name), name,
                        "shape " + shape_to_string(v.shape) + " but config.json implies " +
                            shape_to_string(shape) + note);
        const auto qt = qtype_from_dtype(v.dtype);
        if (!qt)
            throw Error(ckpt_.file_of(name), name,
                        "dtype " + std::string(dtype_info(v.dtype).safetensors_name) +
                            " is not a float type (expected F32, F16 or BF16)");
        return *qt;
    }

    void add(const TensorSpec& s, QType qtype, bool imported) {
        // GemmaRMSNorm computes (1 + w) in float32: that sum, exactly, is the weight we store.
        const bool plus_one = hf_norms_plus_one(config_.arch) && s.row->cls == WeightClass::norm;
        tensors_.push_back({s.name, plus_one ? QType::f32 : qtype, s.shape});
        hf_names_.push_back(s.hf_name);
        imported_.push_back(imported);
        plus_one_.push_back(plus_one);
        stored_.push_back(qtype);
        slices_.push_back({0, s.shape[0]});
    }

    std::span<const uint8_t> norm_plus_one(size_t i, std::vector<uint8_t>& scratch) const {
        const TensorView v = ckpt_.tensor(hf_names_[i]);
        const uint64_t n = tensors_[i].shape.at(0);
        std::vector<float> w(n);
        dequantize_row_ref(stored_[i], v.data.data(), n, w.data());
        for (float& x : w) x += 1.0f;
        scratch.resize(n * sizeof(float));
        std::memcpy(scratch.data(), w.data(), scratch.size());
        return scratch;
    }

    // Tensor i's bytes within its stored tensor's (all of them unless it is a fused part).
    std::span<const uint8_t> slice_of(size_t i, std::span<const uint8_t> stored) const {
        const Slice& s = slices_[i];
        const uint64_t row_bytes = stored.size() / s.of;
        return stored.subspan(s.row0 * row_bytes, tensors_[i].shape[0] * row_bytes);
    }

    SafetensorsCheckpoint ckpt_;
    std::optional<HfQuantConfig> quant_;
    QType quant_target_ = QType::f32;
    std::vector<TensorSpec> specs_;
    std::vector<std::string> hf_names_;  // parallel to tensors_
    std::vector<bool> imported_;         // parallel to tensors_: a GPTQ/AWQ linear
    std::vector<bool> plus_one_;         // parallel to tensors_: a (1 + w) norm given as 1 + w
    std::vector<QType> stored_;          // parallel to tensors_: the checkpoint's type
    // Parallel to tensors_: the rows [row0, row0 + shape[0]) of `of` that the stored tensor holds
    // (row0 0 and `of` shape[0] unless it is a fused part).
    struct Slice {
        uint64_t row0, of;
    };
    std::vector<Slice> slices_;
};

}  // namespace

std::unique_ptr<ModelSource> open_hf_source(const std::string& path, const SourceOptions& options) {
    // config.json first: without it the checkpoint's tensors mean nothing.
    const std::string cfg_path = config_path_for(path);
    const ModelConfig config = read_model_config(cfg_path);
    return std::make_unique<HfSource>(path, cfg_path, config, options);
}

}  // namespace qforge
