// A .qf model as a source: its tensors as stored (quantized ones are copied as they are by
// `quantize`, so every read is checked against the tensor's hash).
#include "core/error.hpp"
#include "formats/qf.hpp"
#include "sources/source_common.hpp"
#include "sources/source_kinds.hpp"
#include "tokenizer/source.hpp"

namespace qforge {

namespace {

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
        for (const auto& t : qf_.tensors())
            tensors_.push_back({t.name, t.qtype, t.shape, t.col_perm});
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

}  // namespace

std::unique_ptr<ModelSource> open_qf_source(const std::string& path) {
    return std::make_unique<QfSource>(path);
}

}  // namespace qforge
