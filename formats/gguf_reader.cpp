// Reading GGUF files. Every number in the file is hostile until checked: lengths and counts
// against the bytes that remain, products in overflow-checked 64-bit arithmetic, tensor extents
// against the data section and against each other.
#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>

#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "formats/gguf.hpp"

namespace qforge {

namespace {

// Keys and tensor names are printable text: UTF-8 without control characters (the spec asks
// for UTF-8; real files use ASCII). Anything else is refused so no later message or output
// file carries raw bytes from the file.
bool is_printable_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x80) {
            if (c < 0x20 || c == 0x7f) return false;
            ++i;
            continue;
        }
        const size_t n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        uint32_t cp = c & (0x7fu >> n);
        for (size_t k = 1; k < n; ++k) {
            const auto b = static_cast<unsigned char>(s[i + k]);
            if ((b >> 6) != 0x2) return false;
            cp = cp << 6 | (b & 0x3fu);
        }
        static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < kMinForLength[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ||
            (cp >= 0x80 && cp < 0xa0))
            return false;
        i += n;
    }
    return true;
}

// Bytes of one scalar of a fixed-size type; 0 for string and array.
uint64_t scalar_bytes(GgufValueType t) {
    switch (t) {
        case GgufValueType::uint8:
        case GgufValueType::int8:
        case GgufValueType::boolean:
            return 1;
        case GgufValueType::uint16:
        case GgufValueType::int16:
            return 2;
        case GgufValueType::uint32:
        case GgufValueType::int32:
        case GgufValueType::float32:
            return 4;
        case GgufValueType::uint64:
        case GgufValueType::int64:
        case GgufValueType::float64:
            return 8;
        case GgufValueType::string:
        case GgufValueType::array:
            break;
    }
    return 0;
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::float64); }

std::string_view scalar_type_name(GgufValueType t) {
    switch (t) {
        case GgufValueType::uint8:
            return "uint8";
        case GgufValueType::int8:
            return "int8";
        case GgufValueType::uint16:
            return "uint16";
        case GgufValueType::int16:
            return "int16";
        case GgufValueType::uint32:
            return "uint32";
        case GgufValueType::int32:
            return "int32";
        case GgufValueType::float32:
            return "float32";
        case GgufValueType::boolean:
            return "bool";
        case GgufValueType::string:
            return "string";
        case GgufValueType::array:
            return "array";
        case GgufValueType::uint64:
            return "uint64";
        case GgufValueType::int64:
            return "int64";
        case GgufValueType::float64:
            return "float64";
    }
    return "?";
}

bool is_unsigned(GgufValueType t) {
    return t == GgufValueType::uint8 || t == GgufValueType::uint16 || t == GgufValueType::uint32 ||
           t == GgufValueType::uint64;
}
bool is_signed(GgufValueType t) {
    return t == GgufValueType::int8 || t == GgufValueType::int16 || t == GgufValueType::int32 ||
           t == GgufValueType::int64;
}
bool is_float(GgufValueType t) {
    return t == GgufValueType::float32 || t == GgufValueType::float64;
}

// A bounds-checked little-endian cursor over the mapping. `what` describes the item being read
// for the "truncated" message.
class Cursor {
  public:
    Cursor(const uint8_t* data, uint64_t size, const std::string& file)
        : data_(data), size_(size), file_(file) {}

    uint64_t position() const { return pos_; }
    uint64_t remaining() const { return size_ - pos_; }

    void need(uint64_t n, const std::string& what) const {
        if (n > remaining())
            throw Error(file_, {},
                        "truncated: " + what + " needs " + std::to_string(n) + " bytes at offset " +
                            std::to_string(pos_) + " but the file has " +
                            std::to_string(remaining()) + " left");
    }
    template <class T>
    T read(const std::string& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof v);
        pos_ += sizeof v;
        return v;
    }
    std::string read_string(const std::string& what, uint64_t max_bytes) {
        const auto len = read<uint64_t>(what + " length");
        if (len > max_bytes)
            throw Error(file_, {},
                        what + " is " + std::to_string(len) + " bytes long, above the limit of " +
                            std::to_string(max_bytes));
        if (len > remaining())
            throw Error(file_, {},
                        what + " length " + std::to_string(len) + " at offset " +
                            std::to_string(pos_ - 8) + " runs past the end of the file (" +
                            std::to_string(remaining()) + " bytes left)");
        std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
        pos_ += len;
        return s;
    }

  private:
    const uint8_t* data_;
    uint64_t size_;
    const std::string& file_;
    uint64_t pos_ = 0;
};

// Appends one element of scalar type `t` (not array) to `v`.
void read_element(Cursor& c, GgufValueType t, GgufValue& v, const std::string& what) {
    switch (t) {
        case GgufValueType::uint8:
            v.uints.push_back(c.read<uint8_t>(what));
            return;
        case GgufValueType::uint16:
            v.uints.push_back(c.read<uint16_t>(what));
            return;
        case GgufValueType::uint32:
            v.uints.push_back(c.read<uint32_t>(what));
            return;
        case GgufValueType::uint64:
            v.uints.push_back(c.read<uint64_t>(what));
            return;
        case GgufValueType::int8:
            v.ints.push_back(c.read<int8_t>(what));
            return;
        case GgufValueType::int16:
            v.ints.push_back(c.read<int16_t>(what));
            return;
        case GgufValueType::int32:
            v.ints.push_back(c.read<int32_t>(what));
            return;
        case GgufValueType::int64:
            v.ints.push_back(c.read<int64_t>(what));
            return;
        case GgufValueType::float32:
            v.floats.push_back(c.read<float>(what));
            return;
        case GgufValueType::float64:
            v.floats.push_back(c.read<double>(what));
            return;
        case GgufValueType::boolean: {
            const auto b = c.read<uint8_t>(what);
            if (b > 1)
                throw Error(what + " is a bool stored as " + std::to_string(b) + ", not 0 or 1");
            v.ints.push_back(b);
            return;
        }
        case GgufValueType::string:
            v.strings.push_back(c.read_string(what, std::numeric_limits<uint64_t>::max()));
            return;
        case GgufValueType::array:
            break;
    }
    throw Error(what + ": arrays of arrays are not supported");
}

GgufValue read_value(Cursor& c, const std::string& key, const std::string& file) {
    const std::string what = "metadata key '" + gguf_excerpt(key) + "'";
    const auto raw_type = c.read<uint32_t>(what + " value type");
    if (!known_value_type(raw_type))
        throw Error(file, {}, what + " has unknown value type " + std::to_string(raw_type));
    GgufValue v;
    v.type = v.element_type = static_cast<GgufValueType>(raw_type);
    if (v.type != GgufValueType::array) {
        read_element(c, v.type, v, what);
        return v;
    }
    const auto raw_elem = c.read<uint32_t>(what + " array element type");
    if (!known_value_type(raw_elem))
        throw Error(file, {},
                    what + " is an array of unknown value type " + std::to_string(raw_elem));
    v.element_type = static_cast<GgufValueType>(raw_elem);
    if (v.element_type == GgufValueType::array)
        throw Error(file, {}, what + " is an array of arrays, which GGUF readers do not support");
    const auto count = c.read<uint64_t>(what + " array length");
    // Each element takes at least this many bytes (a string its 8-byte length), so a count the
    // rest of the file cannot hold is refused before anything is allocated for it.
    const uint64_t min_bytes =
        v.element_type == GgufValueType::string ? 8 : scalar_bytes(v.element_type);
    const auto needed = checked_mul(count, min_bytes);
    if (!needed || *needed > c.remaining())
        throw Error(file, {},
                    what + " claims " + std::to_string(count) + " elements of " +
                        scalar_type_name(v.element_type).data() + ", more than the " +
                        std::to_string(c.remaining()) + " bytes left in the file can hold");
    const std::string elem = what + " element";
    // Reserve for real vocabularies at once, but let a hostile count of one-byte elements grow
    // the vector as bytes are actually read (each is held in 8 bytes here).
    const auto reserve = static_cast<size_t>(std::min<uint64_t>(count, uint64_t{1} << 20));
    if (v.element_type == GgufValueType::string)
        v.strings.reserve(reserve);
    else if (is_float(v.element_type))
        v.floats.reserve(reserve);
    else if (is_unsigned(v.element_type))
        v.uints.reserve(reserve);
    else
        v.ints.reserve(reserve);
    for (uint64_t i = 0; i < count; ++i) read_element(c, v.element_type, v, elem);
    return v;
}

// Rethrows a detail-only Error (from read_element, which does not know the file) with the file.
template <class F>
auto with_file(const std::string& file, F&& f) {
    try {
        return f();
    } catch (const Error& e) {
        if (!e.file().empty()) throw;
        throw e.with_file(file);
    }
}

}  // namespace

// Hostile names can be long and hold any bytes; errors quote at most this much of them, with
// bytes outside printable ASCII written as \xNN so a message stays one line of text.
std::string gguf_excerpt(std::string_view s) {
    constexpr size_t kMax = 80;
    std::string out;
    for (char c : s.substr(0, kMax)) {
        const auto b = static_cast<unsigned char>(c);
        if (b >= 0x20 && b < 0x7f) {
            out += c;
        } else {
            static constexpr char kHex[] = "0123456789abcdef";
            out += {'\\', 'x', kHex[b >> 4], kHex[b & 15]};
        }
    }
    if (s.size() > kMax) out += "... (" + std::to_string(s.size()) + " bytes)";
    return out;
}

std::string gguf_value_type_name(GgufValueType t) { return std::string(scalar_type_name(t)); }

uint64_t GgufValue::size() const {
    return ints.size() + uints.size() + floats.size() + strings.size();
}

GgufFile::GgufFile(const std::string& path) : mapped_(path) { parse(); }

void GgufFile::parse() {
    const std::string& file = mapped_.path();
    Cursor c(mapped_.data(), mapped_.size(), file);
    if (mapped_.size() < sizeof(GgufHeader))
        throw Error(file, {},
                    "truncated: " + std::to_string(mapped_.size()) +
                        " bytes, a GGUF file starts with a 24-byte header");
    GgufHeader h;
    std::memcpy(&h, mapped_.data(), sizeof h);
    if (std::memcmp(h.magic, kGgufMagic, 4) != 0)
        throw Error(file, {}, "not a GGUF file: the first 4 bytes are not \"GGUF\"");
    // A big-endian writer's version 3 reads as 0x03000000 here.
    if (h.version != 0 && (h.version & 0xffffu) == 0)
        throw Error(file, {},
                    "big-endian GGUF (version field " + std::to_string(h.version) +
                        ") is not supported; convert it on a little-endian machine");
    if (h.version < kGgufOldestVersion)
        throw Error(
            file, {},
            "GGUF version " + std::to_string(h.version) +
                " is too old (32-bit counts); re-export the model with a current llama.cpp");
    if (h.version > kGgufVersion)
        throw Error(file, {},
                    "GGUF version " + std::to_string(h.version) + " is newer than version " +
                        std::to_string(kGgufVersion) +
                        ", the newest this qforge reads; update qforge");
    version_ = h.version;
    c.read<GgufHeader>("header");

    // Smallest possible key/value pair: 8-byte key length, a 1-byte key, u32 type, 1-byte value.
    constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
    // Smallest tensor info: name length, 1-byte name, n_dims, one dimension, type, offset.
    constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;
    const auto kv_bytes = checked_mul(h.kv_count, kMinKvBytes);
    if (!kv_bytes || *kv_bytes > c.remaining())
        throw Error(file, {},
                    "header claims " + std::to_string(h.kv_count) +
                        " metadata pairs, more than the " + std::to_string(c.remaining()) +
                        " bytes after the header can hold");
    const auto info_bytes = checked_mul(h.tensor_count, kMinTensorInfoBytes);
    if (!info_bytes || *info_bytes > c.remaining())
        throw Error(file, {},
                    "header claims " + std::to_string(h.tensor_count) + " tensors, more than the " +
                        std::to_string(c.remaining()) + " bytes after the header can hold");

    for (uint64_t i = 0; i < h.kv_count; ++i) {
        std::string key = c.read_string("metadata key " + std::to_string(i), kGgufMaxKeyBytes);
        if (key.empty()) throw Error(file, {}, "metadata key " + std::to_string(i) + " is empty");
        if (!is_printable_utf8(key))
            throw Error(file, {},
                        "metadata key " + std::to_string(i) + " '" + gguf_excerpt(key) +
                            "' is not printable UTF-8");
        GgufValue value = with_file(file, [&] { return read_value(c, key, file); });
        if (!key_index_.emplace(key, metadata_.size()).second)
            throw Error(file, {}, "metadata key '" + gguf_excerpt(key) + "' appears twice");
        metadata_.push_back({std::move(key), std::move(value)});
    }

    if (const GgufValue* a = find("general.alignment")) {
        if (a->type != GgufValueType::uint32)
            throw Error(file, {},
                        "metadata key 'general.alignment' is " + gguf_value_type_name(a->type) +
                            ", expected uint32");
        alignment_ = a->uints.front();
        if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0)
            throw Error(
                file, {},
                "general.alignment " + std::to_string(alignment_) + " is not a power of two");
    }

    for (uint64_t i = 0; i < h.tensor_count; ++i) {
        GgufTensorInfo t;
        t.name = c.read_string("name of tensor " + std::to_string(i),
                               std::numeric_limits<uint64_t>::max());
        if (t.name.empty())
            throw Error(file, {}, "tensor " + std::to_string(i) + " has an empty name");
        if (t.name.size() > kGgufMaxNameBytes)
            throw Error(file, gguf_excerpt(t.name),
                        "name is " + std::to_string(t.name.size()) +
                            " bytes, above ggml's limit of " + std::to_string(kGgufMaxNameBytes));
        if (!is_printable_utf8(t.name))
            throw Error(file, gguf_excerpt(t.name), "name is not printable UTF-8");
        const std::string name = t.name;
        const auto fail = [&](const std::string& detail) { return Error(file, name, detail); };
        const auto n_dims = c.read<uint32_t>("tensor '" + name + "' dimension count");
        if (n_dims == 0 || n_dims > kGgufMaxDims)
            throw fail(std::to_string(n_dims) + " dimensions (ggml allows 1 to " +
                       std::to_string(kGgufMaxDims) + ")");
        for (uint32_t d = 0; d < n_dims; ++d) {
            const auto ne = c.read<uint64_t>("tensor '" + name + "' dimensions");
            if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                throw fail("dimension " + std::to_string(d) + " is " + std::to_string(ne));
            t.ne.push_back(ne);
        }
        const auto type_id = c.read<uint32_t>("tensor '" + name + "' type");
        const GgmlTypeTraits* traits = ggml_type_traits(type_id);
        if (!traits)
            throw fail(ggml_type_removed(type_id)
                           ? "type id " + std::to_string(type_id) +
                                 " is a ggml type that has been removed; re-quantize the model"
                           : "unknown ggml type id " + std::to_string(type_id));
        t.type = traits->type;
        t.offset = c.read<uint64_t>("tensor '" + name + "' offset");

        const auto elements = checked_product(t.ne);
        if (!elements || *elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw fail("shape has more than 2^63 elements");
        t.elements = *elements;
        if (t.ne[0] % traits->block_elems != 0)
            throw fail("row length " + std::to_string(t.ne[0]) + " is not a multiple of " +
                       std::string(traits->name) + "'s block of " +
                       std::to_string(traits->block_elems));
        const auto bytes = checked_mul(t.elements / traits->block_elems, traits->block_bytes);
        if (!bytes) throw fail("size overflows 64 bits");
        t.bytes = *bytes;
        if (t.offset % alignment_ != 0)
            throw fail("offset " + std::to_string(t.offset) +
                       " is not a multiple of the alignment " + std::to_string(alignment_));
        if (!tensor_index_.emplace(t.name, tensors_.size()).second)
            throw fail("appears twice in the tensor list");
        tensors_.push_back(std::move(t));
    }

    data_offset_ = align_up(c.position(), alignment_);
    const uint64_t data_size = mapped_.size() >= data_offset_ ? mapped_.size() - data_offset_ : 0;
    std::vector<const GgufTensorInfo*> by_offset;
    for (const auto& t : tensors_) {
        const auto end = checked_add(t.offset, t.bytes);
        if (!end || *end > data_size)
            throw Error(file, t.name,
                        "bytes [" + std::to_string(t.offset) + ", " +
                            (end ? std::to_string(*end) : std::string("2^64+")) +
                            ") of the data section run past its end (" + std::to_string(data_size) +
                            " bytes from offset " + std::to_string(data_offset_) + ")");
        by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
        return std::tie(a->offset, a->name) < std::tie(b->offset, b->name);
    });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        const GgufTensorInfo& prev = *by_offset[i - 1];
        const GgufTensorInfo& t = *by_offset[i];
        if (t.offset < prev.offset + prev.bytes)
            throw Error(file, t.name,
                        "bytes [" + std::to_string(t.offset) + ", " +
                            std::to_string(t.offset + t.bytes) + ") overlap tensor '" + prev.name +
                            "' at [" + std::to_string(prev.offset) + ", " +
                            std::to_string(prev.offset + prev.bytes) + ")");
    }
}

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

namespace {

[[noreturn]] void wrong_type(const std::string& file, std::string_view key, const GgufValue& v,
                             const std::string& expected) {
    std::string found = gguf_value_type_name(v.type);
    if (v.is_array()) found += " of " + gguf_value_type_name(v.element_type);
    throw Error(file, {},
                "metadata key '" + std::string(key) + "' is " + found + ", expected " + expected);
}

}  // namespace

std::optional<uint64_t> GgufFile::get_uint(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_array() || !(is_unsigned(v->type) || is_signed(v->type)))
        wrong_type(path(), key, *v, "an integer");
    if (is_unsigned(v->type)) return v->uints.front();
    if (v->ints.front() < 0)
        throw Error(path(), {},
                    "metadata key '" + std::string(key) + "' is " +
                        std::to_string(v->ints.front()) + ", expected a non-negative integer");
    return static_cast<uint64_t>(v->ints.front());
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_array() || !is_float(v->type)) wrong_type(path(), key, *v, "float32 or float64");
    return v->floats.front();
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufValueType::boolean) wrong_type(path(), key, *v, "bool");
    return v->ints.front() != 0;
}

const std::string* GgufFile::get_string(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return nullptr;
    if (v->type != GgufValueType::string) wrong_type(path(), key, *v, "string");
    return &v->strings.front();
}

const std::vector<std::string>* GgufFile::get_string_array(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return nullptr;
    if (!v->is_array() || v->element_type != GgufValueType::string)
        wrong_type(path(), key, *v, "array of string");
    return &v->strings;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return {};
    if (!v->is_array() || !(is_signed(v->element_type) || is_unsigned(v->element_type)))
        wrong_type(path(), key, *v, "array of integers");
    if (is_signed(v->element_type)) return v->ints;
    std::vector<int64_t> out;
    out.reserve(v->uints.size());
    for (uint64_t u : v->uints) {
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw Error(path(), {},
                        "metadata key '" + std::string(key) + "' holds " + std::to_string(u) +
                            ", above the int64 range");
        out.push_back(static_cast<int64_t>(u));
    }
    return out;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::tensor_data(const GgufTensorInfo& t) const {
    return {mapped_.data() + data_offset_ + t.offset, static_cast<size_t>(t.bytes)};
}

void GgufFile::release(const GgufTensorInfo& t) const {
    mapped_.release(data_offset_ + t.offset, t.bytes);
}

}  // namespace qforge
