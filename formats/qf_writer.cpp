// .qf writer: preamble placeholder, tensors streamed at aligned offsets, JSON header last, then
// the preamble patched and the file renamed into place (AtomicFile).
#include <xxhash.h>
#include <zstd.h>

#include <cstring>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "formats/qf.hpp"

namespace qforge {

QfWriter::QfWriter(std::string path, QfWriteOptions options)
    : out_(std::move(path)), options_(options) {
    if (options_.version < 1 || options_.version > kQfVersion)
        throw Error(
            out_.final_path(), {},
            "internal error: cannot write format version " + std::to_string(options_.version));
    out_.pad_to(kQfDataAlignment);  // preamble written at finish(); data starts on a page
}

void QfWriter::add_tensor(const std::string& name, QType qtype, std::vector<uint64_t> shape,
                          std::span<const uint8_t> bytes, std::vector<uint32_t> col_perm) {
    const std::string& p = out_.final_path();
    if (finished_) throw Error(p, name, "internal error: tensor added after finish()");
    for (const auto& t : tensors_)
        if (t.name == name) throw Error(p, name, "internal error: tensor written twice");
    auto expected = qtype_tensor_bytes(qtype, shape, qf_row_align(options_.version));
    if (!expected || *expected != bytes.size())
        throw Error(p, name,
                    "internal error: " + std::to_string(bytes.size()) + " bytes for shape " +
                        shape_to_string(shape) + " of " + std::string(qtype_traits(qtype).name));
    out_.pad_to(align_up(out_.position(), kQfTensorAlignment));

    QfTensorInfo t{name,         qtype,        std::move(shape), out_.position() - kQfDataAlignment,
                   bytes.size(), bytes.size(), QfEncoding::raw,  xxh3_64_tag(bytes)};
    std::span<const uint8_t> stored = bytes;
    if (options_.compress && !bytes.empty()) {
        compressed_.resize(ZSTD_compressBound(bytes.size()));
        size_t n = ZSTD_compress(compressed_.data(), compressed_.size(), bytes.data(), bytes.size(),
                                 options_.zstd_level);
        if (ZSTD_isError(n))
            throw Error(p, name, std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
        if (n < bytes.size()) {  // keep compression only where it pays
            t.encoding = QfEncoding::zstd;
            t.stored_length = n;
            stored = {compressed_.data(), n};
        }
    }
    if (!col_perm.empty() && (!qtype_is_quantized(qtype) || t.shape.size() != 2 ||
                              col_perm.size() != t.shape[1] || options_.version != kQfVersion))
        throw Error(p, name, "internal error: a column permutation that does not fit the matrix");
    t.col_perm = std::move(col_perm);
    out_.write(stored);
    tensors_.push_back(std::move(t));
}

std::string QfWriter::header_text(uint32_t& version) const {
    nlohmann::json tensors = nlohmann::json::array();
    version = options_.version;
    for (const auto& t : tensors_) {
        tensors.push_back(qf_tensor_to_json(t));
        if (!t.col_perm.empty()) version = kQfColPermVersion;  // kQfColPermVersion says why
    }
    nlohmann::json header = {
        {"format", "qforge"},      {"format_version", version}, {"model", model_},
        {"tokenizer", tokenizer_}, {"provenance", provenance_}, {"tensors", std::move(tensors)},
    };
    return header.dump(1);
}

uint64_t QfWriter::size_if_finished() const {
    uint32_t version = 0;
    return align_up(out_.position(), kQfTensorAlignment) + header_text(version).size();
}

void QfWriter::finish() {
    const std::string& p = out_.final_path();
    if (finished_) return;
    if (!model_.is_object()) throw Error(p, {}, "internal error: no model config set");
    out_.pad_to(align_up(out_.position(), kQfTensorAlignment));
    const uint64_t data_length = out_.position() - kQfDataAlignment;

    uint32_t version = 0;
    const std::string text = header_text(version);
    const uint64_t header_offset = out_.position();
    out_.write(text.data(), text.size());

    QfPreamble pre{};
    std::memcpy(pre.magic, kQfMagic, sizeof kQfMagic);
    pre.version = version;
    pre.endian_tag = kQfEndianTag;
    pre.header_offset = header_offset;
    pre.header_length = text.size();
    pre.data_offset = kQfDataAlignment;
    pre.data_length = data_length;
    pre.header_checksum = XXH3_64bits(text.data(), text.size());
    pre.tensor_alignment = kQfTensorAlignment;
    out_.write_at(0, {reinterpret_cast<const uint8_t*>(&pre), sizeof pre});
    out_.commit();
    finished_ = true;
}

}  // namespace qforge
