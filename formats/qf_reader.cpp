// .qf reader. The file is hostile until proven otherwise: every size is checked with 64-bit
// overflow-safe arithmetic before it is used as an offset.
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "formats/json_io.hpp"
#include "formats/qf.hpp"
#include "formats/qf_validate.hpp"
#include "formats/zstd_frame.hpp"

namespace qforge {

namespace {

using nlohmann::json;

}  // namespace

std::string_view qf_encoding_name(QfEncoding e) { return e == QfEncoding::raw ? "raw" : "zstd"; }

QfFile::QfFile(const std::string& path, QfOpenOptions options) : file_(path) {
    parse_preamble();
    parse_header();
    parse_tensors();
    if (options.check_model)
        config_ = validate_qf_model(path, header_["model"], header_["tokenizer"], tensors_);
    if (options.verify_checksums) {
        std::vector<uint8_t> scratch;
        for (const auto& t : tensors_) {
            verify_tensor(t, scratch);
            release(t);
        }
    }
}

void QfFile::parse_preamble() {
    const std::string& p = path();
    if (file_.size() < sizeof(QfPreamble))
        throw Error(p, {},
                    "truncated: " + std::to_string(file_.size()) +
                        " bytes, a .qf file starts with a 64-byte preamble");
    std::memcpy(&preamble_, file_.data(), sizeof preamble_);
    if (std::memcmp(preamble_.magic, kQfMagic, sizeof kQfMagic) != 0)
        throw Error(p, {}, "not a .qf file (bad magic; expected \"QFORGE\\r\\n\")");
    if (preamble_.endian_tag != kQfEndianTag)
        throw Error(
            p, {},
            "byte-order tag is wrong: .qf files are little-endian and this file or host is not");
    if (preamble_.version > kQfColPermVersion)
        throw Error(p, {},
                    ".qf format version " + std::to_string(preamble_.version) +
                        " is newer than this qforge reads (up to " +
                        std::to_string(kQfColPermVersion) + "): upgrade qforge to read it");
    if (preamble_.version == 0) throw Error(p, {}, ".qf format version 0 is not a valid version");
    if (preamble_.tensor_alignment == 0 ||
        (preamble_.tensor_alignment & (preamble_.tensor_alignment - 1)))
        throw Error(p, {},
                    "tensor alignment " + std::to_string(preamble_.tensor_alignment) +
                        " is not a power of two");
    if (preamble_.data_offset < sizeof(QfPreamble) || preamble_.data_offset % kQfDataAlignment)
        throw Error(p, {},
                    "data section offset " + std::to_string(preamble_.data_offset) +
                        " is not a multiple of 4096 after the preamble");
    auto data_end = checked_add(preamble_.data_offset, preamble_.data_length);
    if (!data_end || *data_end != preamble_.header_offset)
        throw Error(p, {},
                    "header offset " + std::to_string(preamble_.header_offset) +
                        " does not follow the data section [" +
                        std::to_string(preamble_.data_offset) + ", +" +
                        std::to_string(preamble_.data_length) + ")");
    if (preamble_.header_length > kQfMaxHeaderBytes)
        throw Error(p, {},
                    "header length " + std::to_string(preamble_.header_length) +
                        " exceeds the 256 MiB limit");
    auto header_end = checked_add(preamble_.header_offset, preamble_.header_length);
    if (!header_end || *header_end > file_.size())
        throw Error(p, {},
                    "truncated: the header ends at byte " +
                        (header_end ? std::to_string(*header_end) : std::string("(overflow)")) +
                        " but the file has " + std::to_string(file_.size()) + " bytes");
    if (*header_end != file_.size())
        throw Error(p, {},
                    std::to_string(file_.size() - *header_end) +
                        " unexpected bytes after the header (the header must end the file)");
}

void QfFile::parse_header() {
    const std::string& p = path();
    const auto* begin = reinterpret_cast<const char*>(file_.data() + preamble_.header_offset);
    const uint64_t n = preamble_.header_length;
    if (XXH3_64bits(begin, n) != preamble_.header_checksum)
        throw Error(p, {}, "header checksum mismatch: the file is corrupt");
    JsonParseOptions options;
    options.what = "header";
    header_ = parse_json(std::string_view(begin, static_cast<size_t>(n)), p, options);
    const JsonView h(header_, p);
    if (!h.is_object()) h.expected("a header that is a JSON object");
    for (const char* key :
         {"format", "format_version", "model", "tokenizer", "provenance", "tensors"})
        if (h[key].absent()) throw Error(p, {}, std::string("header lacks \"") + key + "\"");
    if (h["format"].string() != "qforge") h["format"].fail("expected \"qforge\"");
    if (h["format_version"].unsigned_integer() != preamble_.version)
        h["format_version"].fail(header_["format_version"].dump() +
                                 " disagrees with the preamble's " +
                                 std::to_string(preamble_.version));
    h["model"].object();
    if (!h["tokenizer"].raw()->is_null()) h["tokenizer"].object();
    h["provenance"].object();
    h["tensors"].array();
}

// A quantized matrix's col_perm: cols distinct integers below cols.
void QfFile::parse_col_perm(const JsonView& v, QfTensorInfo& t) const {
    if (!qtype_is_quantized(t.qtype))
        throw Error(path(), t.name,
                    "col_perm on a " + std::string(qtype_traits(t.qtype).name) +
                        " tensor: only quantized matrices are permuted");
    const uint64_t cols = t.shape[1];
    if (v.array_size() != cols)
        throw Error(path(), t.name,
                    "col_perm has " + std::to_string(v.array_size()) + " entries for " +
                        std::to_string(cols) + " columns");
    std::vector<bool> seen(cols, false);
    t.col_perm.reserve(cols);
    v.for_each_element([&](const JsonView& d) {
        const uint64_t c = d.unsigned_integer();
        if (c >= cols || seen[c])
            throw Error(path(), t.name,
                        "col_perm entry " + std::to_string(t.col_perm.size()) + " is " +
                            std::to_string(c) + ": not a permutation of 0.." +
                            std::to_string(cols - 1));
        seen[c] = true;
        t.col_perm.push_back(static_cast<uint32_t>(c));
    });
}

void QfFile::parse_tensors() {
    const std::string& p = path();
    JsonView(header_, p)["tensors"].for_each_element([&](const JsonView& e) {
        e.object();
        QfTensorInfo t;
        t.name = e["name"].string();
        if (t.name.empty()) e["name"].fail("a tensor has an empty name");
        if (!index_.emplace(t.name, index_.size()).second)
            throw Error(p, t.name, "tensor name appears twice");
        const std::string qname = e["qtype"].string();
        auto qt = qtype_from_name(qname);
        if (!qt) throw Error(p, t.name, "unknown qtype '" + qname + "'");
        t.qtype = *qt;
        e["shape"].for_each_element(
            [&](const JsonView& d) { t.shape.push_back(d.unsigned_integer()); });
        auto expected = qtype_tensor_bytes(t.qtype, t.shape, qf_row_align(preamble_.version));
        if (!expected && qtype_is_quantized(t.qtype) && (t.shape.size() != 2 || t.shape[1] == 0))
            throw Error(p, t.name,
                        "shape " + shape_to_string(t.shape) + ": " + qname +
                            " tensors must be matrices [rows, cols] with cols > 0");
        if (!expected)
            throw Error(p, t.name,
                        "shape " + shape_to_string(t.shape) + " overflows 64-bit byte counts");
        t.offset = e["offset"].unsigned_integer();
        t.length = e["length"].unsigned_integer();
        t.stored_length = e["stored_length"].unsigned_integer();
        if (t.length != *expected)
            throw Error(p, t.name,
                        "length " + std::to_string(t.length) + " but shape " +
                            shape_to_string(t.shape) + " of " + qname + " needs " +
                            std::to_string(*expected) + " bytes");
        const std::string enc = e["encoding"].string();
        if (enc == "raw") {
            t.encoding = QfEncoding::raw;
            if (t.stored_length != t.length)
                throw Error(p, t.name,
                            "raw tensor stores " + std::to_string(t.stored_length) +
                                " bytes but its length is " + std::to_string(t.length));
        } else if (enc == "zstd") {
            t.encoding = QfEncoding::zstd;
            // Refused at open, before any command sizes a buffer by the declared length.
            const auto most = checked_mul(t.stored_length, kZstdMaxRatio);
            if (most && t.length > *most)
                throw Error(p, t.name,
                            "declares " + size_with_bytes(t.length) + " uncompressed from " +
                                std::to_string(t.stored_length) +
                                " stored bytes; zstd cannot expand more than " +
                                std::to_string(kZstdMaxRatio) + ":1");
        } else {
            throw Error(p, t.name, "unknown encoding '" + enc + "' (expected raw or zstd)");
        }
        t.checksum = e["checksum"].string();
        if (t.checksum.rfind("xxh3-64:", 0) != 0 || t.checksum.size() != 8 + 16)
            throw Error(p, t.name,
                        "checksum '" + t.checksum + "' is not of the form xxh3-64:<16 hex digits>");
        if (t.offset % preamble_.tensor_alignment)
            throw Error(p, t.name,
                        "offset " + std::to_string(t.offset) + " is not a multiple of the " +
                            std::to_string(preamble_.tensor_alignment) + "-byte tensor alignment");
        auto end = checked_add(t.offset, t.stored_length);
        if (!end || *end > preamble_.data_length)
            throw Error(p, t.name,
                        "data [" + std::to_string(t.offset) + ", +" +
                            std::to_string(t.stored_length) +
                            ") lies outside the data section of " +
                            std::to_string(preamble_.data_length) + " bytes");
        if (e.has("col_perm")) {
            if (preamble_.version < kQfColPermVersion)
                throw Error(p, t.name,
                            "col_perm in a version " + std::to_string(preamble_.version) +
                                " file: column permutations need version " +
                                std::to_string(kQfColPermVersion));
            parse_col_perm(e["col_perm"], t);
        }
        tensors_.push_back(std::move(t));
    });
    // No two tensors may share bytes.
    std::vector<const QfTensorInfo*> by_offset;
    for (const auto& t : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        const auto* prev = by_offset[i - 1];
        const auto* cur = by_offset[i];
        if (prev->offset + prev->stored_length > cur->offset && prev->stored_length &&
            cur->stored_length)
            throw Error(p, cur->name, "data overlaps tensor '" + prev->name + "'");
    }
}

const nlohmann::json& QfFile::tokenizer() const {
    if (!has_tokenizer())
        throw Error(path(), {}, "this .qf has no tokenizer; reconvert with --tokenizer FILE");
    return header_.at("tokenizer");
}

const ModelConfig& QfFile::config() const {
    if (!config_)
        throw std::logic_error("QfFile::config(): " + path() + " was opened without check_model");
    return *config_;
}

const QfTensorInfo* QfFile::find(std::string_view name) const {
    const auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

const QfTensorInfo& QfFile::at(std::string_view name) const {
    if (const auto* t = find(name)) return *t;
    throw Error(path(), std::string(name), "tensor not found in this .qf");
}

std::span<const uint8_t> QfFile::tensor_bytes(const QfTensorInfo& t, std::vector<uint8_t>& scratch,
                                              bool verify) const {
    const uint8_t* stored = file_.data() + preamble_.data_offset + t.offset;
    std::span<const uint8_t> bytes;
    if (t.encoding == QfEncoding::raw) {
        bytes = {stored, static_cast<size_t>(t.length)};
    } else {
        zstd_decode_exact({stored, static_cast<size_t>(t.stored_length)}, t.length, path(), t.name,
                          scratch);
        bytes = scratch;
    }
    if (verify) {
        std::string actual = xxh3_64_tag(bytes);
        if (actual != t.checksum)
            throw Error(path(), t.name,
                        "checksum mismatch: header says " + t.checksum + ", data hashes to " +
                            actual + " (the file is corrupt)");
    }
    const uint64_t align = qf_row_align(preamble_.version);
    if (align != kQuantRowAlign && qtype_is_quantized(t.qtype)) {
        // Each old row is the current row followed by its padding: keep the first bytes of each.
        const uint64_t rows = t.shape[0], from = *qtype_row_bytes(t.qtype, t.shape[1], align),
                       to = *qtype_row_bytes(t.qtype, t.shape[1]);
        if (from != to) {
            std::vector<uint8_t> packed(rows * to);
            for (uint64_t r = 0; r < rows; ++r)
                std::memcpy(packed.data() + r * to, bytes.data() + r * from, to);
            scratch = std::move(packed);
            bytes = scratch;
        }
    }
    return bytes;
}

void QfFile::verify_tensor(const QfTensorInfo& t, std::vector<uint8_t>& scratch) const {
    tensor_bytes(t, scratch, true);
}

nlohmann::json qf_tensor_to_json(const QfTensorInfo& t) {
    nlohmann::json j = {{"name", t.name},
                        {"qtype", qtype_traits(t.qtype).name},
                        {"shape", t.shape},
                        {"offset", t.offset},
                        {"length", t.length},
                        {"stored_length", t.stored_length},
                        {"encoding", qf_encoding_name(t.encoding)},
                        {"checksum", t.checksum}};
    if (!t.col_perm.empty()) j["col_perm"] = t.col_perm;  // absent otherwise: older readers
    return j;
}

}  // namespace qforge
