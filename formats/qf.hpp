// Reading and writing .qf files (layout in formats/qf_format.hpp, specification in docs/FORMAT.md).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/mapped_file.hpp"
#include "formats/model_config.hpp"
#include "formats/qf_format.hpp"
#include "formats/qtype.hpp"

namespace qforge {

// The quantized row alignment of a file of this format version (formats/qtype.hpp).
constexpr uint64_t qf_row_align(uint32_t version) {
    return version == 1 ? kQfV1RowAlign : kQuantRowAlign;
}

class JsonView;

struct QfTensorInfo {
    std::string name;
    QType qtype;
    std::vector<uint64_t> shape;
    uint64_t offset;         // relative to the data section
    uint64_t length;         // decoded bytes (what the shape and qtype require)
    uint64_t stored_length;  // bytes in the file (== length for raw)
    QfEncoding encoding;
    std::string checksum;  // "xxh3-64:<hex>" of the decoded bytes
    // Quantized matrices only: stored column j holds input col_perm[j] (an act-order GPTQ
    // import, docs/FORMAT.md "Column permutations"), so y = W x is computed with x gathered by
    // it. Empty: columns in input order (every other tensor).
    std::vector<uint32_t> col_perm = {};
};

struct QfOpenOptions {
    bool verify_checksums =
        false;  // hash every tensor at open (qforge verify does it with progress)
    // Validate the model the file holds (formats/qf_validate.hpp): its config, every tensor
    // against the architecture table, the embedded tokenizer against the vocabulary. Every
    // command opens with it; false reads the container alone (format tests, inspect).
    bool check_model = true;
};

class QfFile {
  public:
    // Maps the file and validates the preamble, the header and every tensor entry, then (with
    // check_model) the model against its config; throws qforge::Error naming the file (and the
    // tensor) on the first problem.
    explicit QfFile(const std::string& path, QfOpenOptions options = {});

    const std::string& path() const { return file_.path(); }
    uint64_t file_size() const { return file_.size(); }
    uint32_t version() const { return preamble_.version; }
    const nlohmann::json& header() const { return header_; }
    const nlohmann::json& model() const { return header_.at("model"); }
    // The validated config; a logic error for a file opened without check_model.
    const ModelConfig& config() const;
    bool has_tokenizer() const { return !header_.at("tokenizer").is_null(); }
    // The tokenizer, or an Error saying the file has none (for commands that need one).
    const nlohmann::json& tokenizer() const;

    const std::vector<QfTensorInfo>& tensors() const { return tensors_; }
    const QfTensorInfo* find(std::string_view name) const;
    const QfTensorInfo& at(std::string_view name) const;  // Error naming the tensor if absent

    // The tensor's decoded bytes in the current row layout: a span into the mapping for raw
    // tensors (zero copy); zstd tensors are decompressed into `scratch`, and quantized tensors of
    // a version 1 file, whose rows were padded to 64 bytes, are repacked into it (so the span
    // then holds fewer bytes than the entry's length). `scratch` is left empty when unused. With
    // `verify`, the checksum (of the bytes as stored, before any repacking) is checked too.
    std::span<const uint8_t> tensor_bytes(const QfTensorInfo& t, std::vector<uint8_t>& scratch,
                                          bool verify = false) const;
    // Checks one tensor's checksum (decoding it if compressed); throws on mismatch.
    void verify_tensor(const QfTensorInfo& t, std::vector<uint8_t>& scratch) const;
    // Drops the tensor's pages from this process (streaming over files larger than memory).
    void release(const QfTensorInfo& t) const {
        file_.release(preamble_.data_offset + t.offset, t.stored_length);
    }

  private:
    void parse_preamble();
    void parse_header();
    void parse_tensors();
    void parse_col_perm(const JsonView& v, QfTensorInfo& t) const;

    MappedFile file_;
    QfPreamble preamble_{};
    nlohmann::json header_;
    std::vector<QfTensorInfo> tensors_;
    std::optional<ModelConfig> config_;              // set by check_model
    std::unordered_map<std::string, size_t> index_;  // name -> tensors_ position: find() per
                                                     // tensor must not scan a million entries
};

struct QfWriteOptions {
    bool compress = false;  // zstd per tensor, kept only where it saves space
    int zstd_level = 3;
    // The format version written: kQfVersion, or 1 (quantized rows padded to 64 bytes; tensors
    // must then be given in that layout) for tests of the readers' compatibility.
    uint32_t version = kQfVersion;
};

// Streams tensors into a new .qf. Nothing appears under `path` until finish() succeeds; an
// exception or interrupt leaves no file behind (see AtomicFile).
class QfWriter {
  public:
    explicit QfWriter(std::string path, QfWriteOptions options = {});

    void set_model(nlohmann::json model) { model_ = std::move(model); }
    void set_tokenizer(nlohmann::json tokenizer) { tokenizer_ = std::move(tokenizer); }
    void set_provenance(nlohmann::json provenance) { provenance_ = std::move(provenance); }

    // Writes the tensor now; `bytes` must hold exactly qtype_tensor_bytes(qtype, shape).
    // col_perm: a quantized matrix's column permutation (QfTensorInfo), or empty.
    void add_tensor(const std::string& name, QType qtype, std::vector<uint64_t> shape,
                    std::span<const uint8_t> bytes, std::vector<uint32_t> col_perm = {});
    void finish();

    uint64_t bytes_written() const { return out_.position(); }
    // The file's size if finish() ran now (the tensors so far, alignment and the header).
    uint64_t size_if_finished() const;

  private:
    // The JSON header as finish() writes it; `version`: the format version it records.
    std::string header_text(uint32_t& version) const;

    AtomicFile out_;
    QfWriteOptions options_;
    nlohmann::json model_;
    nlohmann::json tokenizer_;  // null: the file has no tokenizer
    nlohmann::json provenance_ = nlohmann::json::object();
    std::vector<QfTensorInfo> tensors_;
    std::vector<uint8_t> compressed_;
    bool finished_ = false;
};

// The JSON form of a tensor entry, shared by the writer and `qforge inspect --json`.
nlohmann::json qf_tensor_to_json(const QfTensorInfo& t);
std::string_view qf_encoding_name(QfEncoding e);

}  // namespace qforge
