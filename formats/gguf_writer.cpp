#include "formats/gguf_writer.hpp"

#include <cstring>
#include <stdexcept>

#include "core/checked_math.hpp"
#include "core/error.hpp"

namespace qforge {

namespace {

// Little-endian serialization into a byte buffer (every supported host is little-endian, as
// the reader assumes).
class Bytes {
  public:
    template <typename T>
    void put(T v) {
        const size_t at = b_.size();
        b_.resize(at + sizeof v);
        std::memcpy(b_.data() + at, &v, sizeof v);
    }
    void put_string(const std::string& s) {
        put<uint64_t>(s.size());
        b_.insert(b_.end(), s.begin(), s.end());
    }
    void put_element(GgufValueType t, const GgufValue& v, size_t i);
    const std::vector<uint8_t>& data() const { return b_; }

  private:
    std::vector<uint8_t> b_;
};

void Bytes::put_element(GgufValueType t, const GgufValue& v, size_t i) {
    switch (t) {
        case GgufValueType::uint8:
            return put(static_cast<uint8_t>(v.uints.at(i)));
        case GgufValueType::uint16:
            return put(static_cast<uint16_t>(v.uints.at(i)));
        case GgufValueType::uint32:
            return put(static_cast<uint32_t>(v.uints.at(i)));
        case GgufValueType::uint64:
            return put(v.uints.at(i));
        case GgufValueType::int8:
            return put(static_cast<int8_t>(v.ints.at(i)));
        case GgufValueType::int16:
            return put(static_cast<int16_t>(v.ints.at(i)));
        case GgufValueType::int32:
            return put(static_cast<int32_t>(v.ints.at(i)));
        case GgufValueType::int64:
            return put(v.ints.at(i));
        case GgufValueType::boolean:
            return put(static_cast<uint8_t>(v.ints.at(i) != 0));
        case GgufValueType::float32:
            return put(static_cast<float>(v.floats.at(i)));
        case GgufValueType::float64:
            return put(v.floats.at(i));
        case GgufValueType::string:
            return put_string(v.strings.at(i));
        case GgufValueType::array:
            break;
    }
    throw std::logic_error("GgufWriter: arrays of arrays are not written");
}

GgufValue scalar(GgufValueType t) {
    GgufValue v;
    v.type = v.element_type = t;
    return v;
}

GgufValue array_of(GgufValueType t) {
    GgufValue v;
    v.type = GgufValueType::array;
    v.element_type = t;
    return v;
}

}  // namespace

GgufValue gguf_u32(uint32_t x) {
    GgufValue v = scalar(GgufValueType::uint32);
    v.uints = {x};
    return v;
}
GgufValue gguf_f32(float x) {
    GgufValue v = scalar(GgufValueType::float32);
    v.floats = {static_cast<double>(x)};
    return v;
}
GgufValue gguf_bool(bool x) {
    GgufValue v = scalar(GgufValueType::boolean);
    v.ints = {x ? 1 : 0};
    return v;
}
GgufValue gguf_string(std::string x) {
    GgufValue v = scalar(GgufValueType::string);
    v.strings = {std::move(x)};
    return v;
}
GgufValue gguf_string_array(std::vector<std::string> x) {
    GgufValue v = array_of(GgufValueType::string);
    v.strings = std::move(x);
    return v;
}
GgufValue gguf_f32_array(std::vector<double> x) {
    GgufValue v = array_of(GgufValueType::float32);
    for (double d : x)
        if (static_cast<double>(static_cast<float>(d)) != d)
            throw std::logic_error("gguf_f32_array: a value that is not a float32");
    v.floats = std::move(x);
    return v;
}
GgufValue gguf_i32_array(std::vector<int64_t> x) {
    GgufValue v = array_of(GgufValueType::int32);
    v.ints = std::move(x);
    return v;
}

GgufWriter::GgufWriter(std::string path, uint32_t alignment)
    : out_(std::move(path)), alignment_(alignment) {
    if (alignment_ == 0 || alignment_ % 8 != 0)
        throw std::logic_error("GgufWriter: the alignment must be a positive multiple of 8");
    add("general.alignment", gguf_u32(alignment_));
}

void GgufWriter::add(std::string key, GgufValue value) {
    if (header_written_) throw std::logic_error("GgufWriter::add after the header");
    for (const GgufKeyValue& kv : metadata_)
        if (kv.key == key) throw std::logic_error("GgufWriter: duplicate key " + key);
    if (!value.is_array() && value.size() != 1)
        throw std::logic_error("GgufWriter: a scalar must hold one value: " + key);
    metadata_.push_back({std::move(key), std::move(value)});
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type,
                            std::span<const uint64_t> shape) {
    if (header_written_) throw std::logic_error("GgufWriter::add_tensor after the header");
    if (name.size() > kGgufMaxNameBytes)
        throw Error(path(), name,
                    "tensor name is " + std::to_string(name.size()) + " bytes; GGUF allows " +
                        std::to_string(kGgufMaxNameBytes));
    if (shape.empty() || shape.size() > kGgufMaxDims)
        throw std::logic_error("GgufWriter: a tensor has 1 to 4 dimensions");
    const GgmlTypeTraits& tr = ggml_type_traits(type);
    GgufTensorInfo t{name, type, {shape.rbegin(), shape.rend()}, 0, 0, 0};
    if (t.ne[0] % tr.block_elems != 0)
        throw Error(path(), name,
                    "rows of " + std::to_string(t.ne[0]) + " elements are not whole " +
                        std::string(tr.name) + " blocks of " + std::to_string(tr.block_elems));
    const auto elements = checked_product(shape);
    const auto bytes =
        elements ? checked_mul(*elements / tr.block_elems, tr.block_bytes) : std::nullopt;
    if (!bytes) throw Error(path(), name, "tensor size overflows 64 bits");
    t.elements = *elements;
    t.bytes = *bytes;
    t.offset = data_bytes_;
    data_bytes_ += (t.bytes + alignment_ - 1) / alignment_ * alignment_;
    tensors_.push_back(std::move(t));
}

void GgufWriter::write_header() {
    Bytes b;
    b.put(GgufHeader{{kGgufMagic[0], kGgufMagic[1], kGgufMagic[2], kGgufMagic[3]},
                     kGgufVersion,
                     tensors_.size(),
                     metadata_.size()});
    for (const GgufKeyValue& kv : metadata_) {
        b.put_string(kv.key);
        b.put(static_cast<uint32_t>(kv.value.type));
        if (kv.value.is_array()) {
            b.put(static_cast<uint32_t>(kv.value.element_type));
            b.put<uint64_t>(kv.value.size());
        }
        for (uint64_t i = 0; i < kv.value.size(); ++i)
            b.put_element(kv.value.element_type, kv.value, i);
    }
    for (const GgufTensorInfo& t : tensors_) {
        b.put_string(t.name);
        b.put(static_cast<uint32_t>(t.ne.size()));
        for (uint64_t n : t.ne) b.put(n);
        b.put(static_cast<uint32_t>(t.type));
        b.put(t.offset);
    }
    out_.write(b.data());
    data_start_ = (out_.position() + alignment_ - 1) / alignment_ * alignment_;
    out_.pad_to(data_start_);
    header_written_ = true;
}

void GgufWriter::write_tensor(std::span<const uint8_t> bytes) {
    if (!header_written_) write_header();
    if (next_tensor_ >= tensors_.size())
        throw std::logic_error("GgufWriter: more tensors written than added");
    const GgufTensorInfo& t = tensors_[next_tensor_++];
    if (bytes.size() != t.bytes)
        throw std::logic_error("GgufWriter: tensor " + t.name + " has the wrong byte count");
    out_.pad_to(data_start_ + t.offset);
    out_.write(bytes);
}

void GgufWriter::finish() {
    if (!header_written_) write_header();
    if (next_tensor_ != tensors_.size())
        throw std::logic_error("GgufWriter::finish: not every tensor was written");
    out_.pad_to(data_start_ + data_bytes_);
    out_.commit();
}

}  // namespace qforge
