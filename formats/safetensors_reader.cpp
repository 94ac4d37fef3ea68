// Reading safetensors files and checkpoints. Every number in a header is hostile until checked:
// lengths against the file size, products in overflow-checked 64-bit arithmetic, offsets against
// the data section and against each other.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "formats/json_io.hpp"
#include "formats/safetensors.hpp"

namespace qforge {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Real headers nest three deep (object, entry, shape); a far tighter bound than the general
// kMaxJsonDepth costs nothing here.
constexpr int kMaxHeaderDepth = 32;

// Dtypes of the reference implementation that the DType table does not carry: named
// "unsupported" in errors, so that a real checkpoint is not mistaken for a corrupt one.
constexpr std::string_view kUnsupportedDTypes[] = {
    "BOOL", "F4",  "F6_E2M3", "F6_E3M2", "F8_E5M2", "F8_E4M3", "F8_E8M0",
    "I16",  "U16", "U32",     "U64",     "F64",     "C64",
};

// Hostile names and strings can be megabytes long; errors quote at most this much of them.
std::string header_excerpt(std::string_view s) {
    constexpr size_t kMax = 120;
    if (s.size() <= kMax) return std::string(s);
    return std::string(s.substr(0, kMax)) + "... (" + std::to_string(s.size()) + " bytes)";
}

// What a JSON value is, for "expected X, found Y" messages; never dumps a large document.
std::string describe_header_value(const json& v) {
    if (v.is_number()) return v.dump();
    if (v.is_string())
        return "the string \"" + header_excerpt(v.get_ref<const std::string&>()) + "\"";
    return std::string("a JSON ") + v.type_name();
}

// Untrusted JSON through the one parser (formats/json_io.hpp), refusing repeated keys: in a
// header a key repeated at depth 1 is a tensor named twice, reported with that name.
json parse_untrusted_json(std::string_view text, const std::string& file, const char* what,
                          bool top_keys_are_tensors) {
    JsonParseOptions options;
    options.what = what;
    options.max_depth = kMaxHeaderDepth;
    options.reject_duplicate_keys = true;
    options.top_keys_are_tensors = top_keys_are_tensors;
    return parse_json(text, file, options);
}

DType parse_dtype(const json& v, const std::string& file, const std::string& name) {
    if (!v.is_string())
        throw Error(file, name,
                    "dtype is " + describe_header_value(v) + ", expected a string such as \"F32\"");
    const auto& s = v.get_ref<const std::string&>();
    if (auto t = dtype_from_safetensors_name(s)) return *t;
    std::string supported;
    for (const auto& row : kDTypes)
        supported += (supported.empty() ? "" : ", ") + std::string(row.safetensors_name);
    const bool known = std::find(std::begin(kUnsupportedDTypes), std::end(kUnsupportedDTypes), s) !=
                       std::end(kUnsupportedDTypes);
    throw Error(file, name,
                std::string(known ? "unsupported" : "unknown") + " dtype '" + header_excerpt(s) +
                    "' (supported: " + supported + ")");
}

std::vector<uint64_t> parse_shape(const json& v, const std::string& file, const std::string& name) {
    if (!v.is_array())
        throw Error(file, name,
                    "shape is " + describe_header_value(v) +
                        ", expected an array of non-negative integers");
    std::vector<uint64_t> shape;
    shape.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_number_unsigned())
            throw Error(file, name,
                        "shape[" + std::to_string(i) + "] is " + describe_header_value(v[i]) +
                            ", expected a non-negative integer");
        shape.push_back(v[i].get<uint64_t>());
    }
    return shape;
}

// One header entry -> SafetensorsTensorInfo, with its byte count checked against the data section.
SafetensorsTensorInfo parse_entry(const std::string& full_name, const json& entry,
                                  uint64_t data_size, const std::string& file) {
    const std::string name = header_excerpt(full_name);  // as errors show it
    if (!entry.is_object())
        throw Error(file, name,
                    "header entry is " + describe_header_value(entry) +
                        ", expected an object with dtype, shape, data_offsets");
    for (const auto& [key, value] : entry.items())
        if (key != "dtype" && key != "shape" && key != "data_offsets")
            throw Error(file, name,
                        "unexpected key '" + header_excerpt(key) +
                            "' (expected only dtype, shape, data_offsets)");
    for (const char* key : {"dtype", "shape", "data_offsets"})
        if (!entry.contains(key)) throw Error(file, name, std::string("missing key '") + key + "'");

    SafetensorsTensorInfo t{full_name, parse_dtype(entry["dtype"], file, name),
                            parse_shape(entry["shape"], file, name), 0, 0};
    const std::string type = std::string(dtype_info(t.dtype).safetensors_name);
    const auto elements = checked_product(t.shape);
    if (!elements)
        throw Error(file, name,
                    "shape " + shape_to_string(t.shape) + " has more than 2^64 elements");
    const auto needed = checked_mul(*elements, dtype_info(t.dtype).size);
    if (!needed)
        throw Error(
            file, name,
            "shape " + shape_to_string(t.shape) + " of " + type + " needs more than 2^64 bytes");

    const json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
        const std::string found = offsets.is_array() && offsets.size() == 2
                                      ? "[" + describe_header_value(offsets[0]) + ", " +
                                            describe_header_value(offsets[1]) + "]"
                                      : describe_header_value(offsets);
        throw Error(file, name,
                    "data_offsets is " + found + ", expected two unsigned integers [begin, end]");
    }
    t.begin = offsets[0].get<uint64_t>();
    t.end = offsets[1].get<uint64_t>();
    const std::string range =
        "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ")";
    if (t.begin > t.end) throw Error(file, name, range + ": begin is after end");
    if (t.end > data_size)
        throw Error(file, name,
                    range + " run past the end of the data section (" + std::to_string(data_size) +
                        " bytes)");
    if (t.end - t.begin != *needed)
        throw Error(file, name,
                    range + " hold " + std::to_string(t.end - t.begin) + " bytes but shape " +
                        shape_to_string(t.shape) + " of " + type + " needs " +
                        std::to_string(*needed));
    return t;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : mapped_(path) { parse_header(); }

void SafetensorsFile::parse_header() {
    const std::string& file = mapped_.path();
    const uint64_t size = mapped_.size();
    if (size < 8)
        throw Error(file, {},
                    "file is " + std::to_string(size) +
                        " bytes, too short for the 8-byte header length; not a safetensors file");
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | mapped_.data()[i];  // little-endian
    if (header_len > kSafetensorsMaxHeaderBytes)
        throw Error(file, {},
                    "header length " + std::to_string(header_len) + " exceeds the limit of " +
                        std::to_string(kSafetensorsMaxHeaderBytes) +
                        " bytes; not a safetensors file, or corrupt");
    if (header_len > size - 8)
        throw Error(file, {},
                    "header length " + std::to_string(header_len) +
                        " runs past the end of the file (" + std::to_string(size) + " bytes)");
    data_offset_ = 8 + header_len;
    const uint64_t data_size = size - data_offset_;

    const std::string_view text(reinterpret_cast<const char*>(mapped_.data() + 8), header_len);
    const json header = parse_untrusted_json(text, file, "header", true);
    if (!header.is_object())
        throw Error(file, {},
                    "header is " + describe_header_value(header) + ", expected a JSON object");

    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            if (!entry.is_object())
                throw Error(file, {},
                            "__metadata__ is " + describe_header_value(entry) +
                                ", expected an object of strings");
            for (const auto& [key, value] : entry.items()) {
                if (!value.is_string())
                    throw Error(file, {},
                                "__metadata__ value for key '" + header_excerpt(key) + "' is " +
                                    describe_header_value(value) + ", expected a string");
                metadata_.emplace(key, value.get<std::string>());
            }
            continue;
        }
        tensors_.push_back(parse_entry(name, entry, data_size, file));
    }

    std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) {
        return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
    });
    // Sorted by begin, a non-empty tensor overlaps an earlier one iff it starts before the
    // furthest end seen so far. Empty tensors hold no bytes and overlap nothing.
    const SafetensorsTensorInfo* furthest = nullptr;
    for (const auto& t : tensors_) {
        if (t.begin == t.end) continue;
        if (furthest && t.begin < furthest->end)
            throw Error(file, t.name,
                        "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                            ") overlap tensor '" + header_excerpt(furthest->name) + "' at [" +
                            std::to_string(furthest->begin) + ", " + std::to_string(furthest->end) +
                            ")");
        if (!furthest || t.end > furthest->end) furthest = &t;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
}

const SafetensorsTensorInfo* SafetensorsFile::find(std::string_view name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

TensorView SafetensorsFile::view(const SafetensorsTensorInfo& t) const {
    const uint8_t* p = mapped_.data() + data_offset_ + t.begin;
    return {t.name, t.dtype, t.shape, {p, static_cast<size_t>(t.end - t.begin)}};
}

void SafetensorsFile::release(const SafetensorsTensorInfo& t) const {
    mapped_.release(data_offset_ + t.begin, t.end - t.begin);
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: one file, or shards named by an index.

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// Why a directory is not a safetensors checkpoint, in terms of what it does hold.
[[noreturn]] void fail_unrecognised_dir(const std::string& dir) {
    std::vector<std::string> safetensors, pytorch;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (e.path().extension() == ".safetensors") safetensors.push_back(name);
        if (name.starts_with("pytorch_model") && e.path().extension() == ".bin")
            pytorch.push_back(name);
    }
    std::sort(safetensors.begin(), safetensors.end());
    if (!safetensors.empty()) {
        std::string list;
        for (const auto& n : safetensors) list += (list.empty() ? "" : ", ") + n;
        throw Error(dir, {},
                    std::string("has neither ") + kIndexName + " nor " + kSingleName +
                        ", only other .safetensors files (" + list +
                        "); pass one of them as the path");
    }
    std::string detail = std::string("no safetensors checkpoint here (neither ") + kIndexName +
                         " nor " + kSingleName + ")";
    if (!pytorch.empty())
        detail +=
            "; " + pytorch.front() +
            " is a PyTorch pickle checkpoint, which is not supported: save it as safetensors first";
    throw Error(dir, {}, detail);
}

// A shard named by the index must be a plain file name in the checkpoint directory: the index
// is untrusted, and "../x" or "/etc/x" would make us read outside it.
bool is_plain_file_name(const std::string& s) {
    return !s.empty() && s != "." && s != ".." &&
           s.find_first_of(std::string_view("/\\\0", 3)) == std::string::npos;
}

}  // namespace

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path) {
    // error_code overloads throughout: a filesystem_error must not escape in place of an Error.
    std::error_code ec;
    const auto status = fs::status(path, ec);
    if (ec && ec != std::errc::no_such_file_or_directory)
        throw Error(path, {}, "cannot access: " + ec.message());
    if (!fs::exists(status)) throw Error(path, {}, "no such file or directory");
    if (fs::is_directory(status)) {
        const std::string index = (fs::path(path) / kIndexName).string();
        const std::string single = (fs::path(path) / kSingleName).string();
        if (fs::exists(index, ec)) {
            open_sharded(index, path);
            return;
        }
        if (!fs::exists(single, ec)) fail_unrecognised_dir(path);
        files_.push_back(single);
    } else {
        files_.push_back(path);
    }
    shards_.push_back(std::make_unique<SafetensorsFile>(files_.front()));
    for (const auto& t : shards_.front()->tensors()) locations_.emplace(t.name, Location{0, &t});
}

void SafetensorsCheckpoint::open_sharded(const std::string& index_path, const std::string& dir) {
    const MappedFile index_file(index_path);
    const std::string_view text(reinterpret_cast<const char*>(index_file.data()),
                                index_file.size());
    const json index = parse_untrusted_json(text, index_path, "index", false);
    if (!index.is_object())
        throw Error(index_path, {},
                    "index is " + describe_header_value(index) + ", expected a JSON object");
    if (!index.contains("weight_map")) throw Error(index_path, {}, "missing key 'weight_map'");
    const json& weight_map = index["weight_map"];
    if (!weight_map.is_object() || weight_map.empty())
        throw Error(index_path, {},
                    "weight_map is " + describe_header_value(weight_map) +
                        ", expected a non-empty object of tensor name -> shard file");

    std::map<std::string, std::string> shard_of;  // tensor -> shard file name
    std::set<std::string> shard_names;            // sorted: model-00001-of-0000N first
    for (const auto& [name, shard] : weight_map.items()) {
        if (!shard.is_string())
            throw Error(index_path, name,
                        "weight_map value is " + describe_header_value(shard) +
                            ", expected a shard file name");
        const auto& s = shard.get_ref<const std::string&>();
        if (!is_plain_file_name(s))
            throw Error(index_path, name,
                        "shard '" + header_excerpt(s) +
                            "' is not a plain file name in the checkpoint directory");
        shard_of.emplace(name, s);
        shard_names.insert(s);
    }

    std::map<std::string, size_t> shard_index;
    for (const auto& s : shard_names) {
        const std::string shard_path = (fs::path(dir) / s).string();
        std::error_code ec;
        if (!fs::exists(shard_path, ec))
            throw Error(index_path, {},
                        "shard '" + s + "' is listed in the index but does not exist");
        shard_index.emplace(s, files_.size());
        files_.push_back(shard_path);
        shards_.push_back(std::make_unique<SafetensorsFile>(shard_path));
    }
    // Every tensor of every shard must be where the index says, once; and nothing unlisted.
    for (size_t i = 0; i < shards_.size(); ++i) {
        for (const auto& t : shards_[i]->tensors()) {
            const auto listed = shard_of.find(t.name);
            if (listed == shard_of.end())
                throw Error(files_[i], t.name,
                            std::string("is in this shard but not listed in ") + kIndexName);
            const auto [it, inserted] = locations_.emplace(t.name, Location{i, &t});
            if (!inserted)
                throw Error(files_[i], t.name,
                            "is also present in shard '" + files_[it->second.shard] + "'");
        }
    }
    for (const auto& [name, shard] : shard_of) {
        const auto it = locations_.find(name);
        if (it == locations_.end() || it->second.shard != shard_index.at(shard))
            throw Error(
                index_path, name,
                "is listed in the index under shard '" + shard + "' but absent from that shard");
    }
}

const SafetensorsCheckpoint::Location& SafetensorsCheckpoint::locate(std::string_view name) const {
    auto it = locations_.find(name);
    if (it == locations_.end())
        throw Error(
            files_.size() == 1 ? files_.front() : fs::path(files_.front()).parent_path().string(),
            header_excerpt(name), "no such tensor in the checkpoint");
    return it->second;
}

std::vector<std::string> SafetensorsCheckpoint::tensor_names() const {
    std::vector<std::string> names;
    names.reserve(locations_.size());
    for (const auto& shard : shards_)
        for (const auto& t : shard->tensors()) names.push_back(t.name);
    return names;
}

bool SafetensorsCheckpoint::contains(std::string_view name) const {
    return locations_.find(name) != locations_.end();
}

const SafetensorsTensorInfo* SafetensorsCheckpoint::find(std::string_view name) const {
    auto it = locations_.find(name);
    return it == locations_.end() ? nullptr : it->second.info;
}

TensorView SafetensorsCheckpoint::tensor(std::string_view name) const {
    const Location& loc = locate(name);
    return shards_[loc.shard]->view(*loc.info);
}

const std::string& SafetensorsCheckpoint::file_of(std::string_view name) const {
    return files_[locate(name).shard];
}

void SafetensorsCheckpoint::release(std::string_view name) const {
    const Location& loc = locate(name);
    shards_[loc.shard]->release(*loc.info);
}

uint64_t SafetensorsCheckpoint::total_tensor_bytes() const {
    // Cannot overflow: each tensor lies inside a mapped file. Checked anyway, as a reader should.
    uint64_t total = 0;
    for (const auto& [name, loc] : locations_) {
        const auto sum = checked_add(total, loc.info->end - loc.info->begin);
        if (!sum) throw Error({}, name, "total tensor bytes overflow 64 bits");
        total = *sum;
    }
    return total;
}

}  // namespace qforge
