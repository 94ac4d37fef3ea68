// GGUF: llama.cpp's single-file model format, read so that its models can be converted to .qf.
//
// Layout of a version 3 (and 2) file, all integers little-endian (ggml's gguf.h and the spec in
// llama.cpp's docs, gguf.md):
//   u8[4]   magic "GGUF"
//   u32     version (3; 2 is the same layout; 1 used 32-bit counts and is refused)
//   u64     tensor_count, u64 kv_count
//   kv_count key/value pairs: string key, u32 value type (GgufValueType), value.
//           string = u64 byte length + bytes (no terminator); array = u32 element type,
//           u64 count, elements (arrays of arrays are not written by llama.cpp, nor read here).
//   tensor_count tensor infos: string name, u32 n_dims (1..4), u64 ne[n_dims] (ne[0] is the
//           fastest-varying dimension: a [rows, cols] matrix is ne = {cols, rows}), u32 ggml type,
//           u64 offset relative to the data section (a multiple of the alignment).
//   zero padding to a multiple of the alignment (general.alignment, u32, default 32)
//   the data section: each tensor's blocks, row-major, ne[0] / block_elems blocks per row.
//
// Files are untrusted: every count, length, offset and product is checked in 64-bit
// overflow-safe arithmetic against the file's size before it is used, and every failure is a
// qforge::Error naming the file (and the key or tensor). Tensor bytes are views into a
// read-only mapping.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.hpp"

namespace qforge {

inline constexpr char kGgufMagic[4] = {'G', 'G', 'U', 'F'};
inline constexpr uint32_t kGgufVersion = 3;        // the newest version this code reads
inline constexpr uint32_t kGgufOldestVersion = 2;  // v2 differs from v3 only on big-endian hosts
inline constexpr uint64_t kGgufDefaultAlignment = 32;  // when general.alignment is absent
inline constexpr uint32_t kGgufMaxDims = 4;            // GGML_MAX_DIMS
inline constexpr uint64_t kGgufMaxNameBytes = 63;      // GGML_MAX_NAME (64) less the terminator
inline constexpr uint64_t kGgufMaxKeyBytes = 65535;    // the spec's limit on key length

// The fixed start of every file.
struct GgufHeader {
    char magic[4];          // "GGUF"
    uint32_t version;       // reads as 0x03000000 when written by a big-endian host
    uint64_t tensor_count;  // tensor infos that follow the metadata
    uint64_t kv_count;      // metadata key/value pairs
};
static_assert(sizeof(GgufHeader) == 24, "the GGUF header is 24 packed bytes");

// Metadata value types, as stored (u32).
enum class GgufValueType : uint32_t {
    uint8 = 0,
    int8 = 1,
    uint16 = 2,
    int16 = 3,
    uint32 = 4,
    int32 = 5,
    float32 = 6,
    boolean = 7,
    string = 8,
    array = 9,
    uint64 = 10,
    int64 = 11,
    float64 = 12,
};

// "uint32", "array of string", ...
std::string gguf_value_type_name(GgufValueType t);

// A string from a GGUF file as error messages quote it: at most 80 bytes, and every byte
// outside printable ASCII written as \xNN.
std::string gguf_excerpt(std::string_view s);

// One metadata value. A scalar is held as a one-element vector of its kind, so scalars and
// arrays share the accessors below; only the vector of element_type's kind is used.
struct GgufValue {
    GgufValueType type = GgufValueType::uint8;          // array for arrays, else the scalar type
    GgufValueType element_type = GgufValueType::uint8;  // == type for scalars
    std::vector<int64_t> ints;                          // int8..int64 and bool (0 or 1)
    std::vector<uint64_t> uints;                        // uint8..uint64
    std::vector<double> floats;        // float32, float64 (float32 values widened exactly)
    std::vector<std::string> strings;  // string

    bool is_array() const { return type == GgufValueType::array; }
    uint64_t size() const;  // elements (1 for a scalar)
};

struct GgufKeyValue {
    std::string key;
    GgufValue value;
};

// ggml tensor types, with their ids as stored. Gaps are ids of removed types (Q4_2, Q4_3, the
// Q4_0_4_4-style repacked types), which the reader names as removed.
enum class GgmlType : uint32_t {
    f32 = 0,
    f16 = 1,
    q4_0 = 2,
    q4_1 = 3,
    q5_0 = 6,
    q5_1 = 7,
    q8_0 = 8,
    q8_1 = 9,
    q2_k = 10,
    q3_k = 11,
    q4_k = 12,
    q5_k = 13,
    q6_k = 14,
    q8_k = 15,
    iq2_xxs = 16,
    iq2_xs = 17,
    iq3_xxs = 18,
    iq1_s = 19,
    iq4_nl = 20,
    iq3_s = 21,
    iq2_s = 22,
    iq4_xs = 23,
    i8 = 24,
    i16 = 25,
    i32 = 26,
    i64 = 27,
    f64 = 28,
    iq1_m = 29,
    bf16 = 30,
    tq1_0 = 34,
    tq2_0 = 35,
    mxfp4 = 39,
    nvfp4 = 40,
    q1_0 = 41,
};

// Dequantizes `blocks` consecutive blocks of a type into block_elems * blocks floats.
using GgmlDequantFn = void (*)(const uint8_t* src, float* dst, uint64_t blocks);

// One row of ggml's type-traits table: every code path that sizes or dequantizes a GGUF tensor
// consults it (formats/gguf_dequant.cpp holds the table and checks each block struct's size
// against it).
struct GgmlTypeTraits {
    GgmlType type;
    std::string_view name;   // ggml's name: "Q4_K", "BF16", ...
    uint32_t block_elems;    // elements per block (1 for plain types)
    uint32_t block_bytes;    // bytes per block
    GgmlDequantFn to_float;  // nullptr: known to the reader (sized), but not dequantized
};

// The row of a stored type id; nullptr for an unknown or removed id.
const GgmlTypeTraits* ggml_type_traits(uint32_t id);
const GgmlTypeTraits& ggml_type_traits(GgmlType type);
// Every row, in id order.
std::span<const GgmlTypeTraits> ggml_type_table();
// Whether `id` named a type ggml has since removed (4, 5: Q4_2, Q4_3; 31..33, 36..38: repacked
// Q4_0 and IQ4_NL variants).
bool ggml_type_removed(uint32_t id);

struct GgufTensorInfo {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;  // ggml order: ne[0] is the row length
    uint64_t offset;           // relative to the data section
    uint64_t bytes;            // what ne and the type require
    uint64_t elements;

    // Torch order, [rows, cols] for a matrix: ne reversed.
    std::vector<uint64_t> shape() const { return {ne.rbegin(), ne.rend()}; }
};

class GgufFile {
  public:
    // Maps the file and validates the header, every key/value pair and every tensor info;
    // throws qforge::Error naming the file (and the key or tensor) on the first problem.
    explicit GgufFile(const std::string& path);

    const std::string& path() const { return mapped_.path(); }
    uint64_t file_size() const { return mapped_.size(); }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }  // absolute

    const std::vector<GgufKeyValue>& metadata() const { return metadata_; }  // file order
    const GgufValue* find(std::string_view key) const;                       // nullptr when absent

    // Typed access: nullopt / nullptr when the key is absent, an Error naming the key and both
    // types when it holds another type. Integers of any width convert when the value fits.
    std::optional<uint64_t> get_uint(std::string_view key) const;
    std::optional<double> get_float(std::string_view key) const;  // float32/64 only
    std::optional<bool> get_bool(std::string_view key) const;
    const std::string* get_string(std::string_view key) const;
    const std::vector<std::string>* get_string_array(std::string_view key) const;
    // An array of any integer type, as int64 (uint64 values above INT64_MAX are an Error).
    std::vector<int64_t> get_int_array(std::string_view key) const;  // empty when absent

    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // file order
    const GgufTensorInfo* find_tensor(std::string_view name) const;          // nullptr if absent
    std::span<const uint8_t> tensor_data(const GgufTensorInfo& t) const;
    void release(const GgufTensorInfo& t) const;  // MappedFile::release of its bytes

  private:
    void parse();

    MappedFile mapped_;
    uint32_t version_ = 0;
    uint64_t alignment_ = kGgufDefaultAlignment;
    uint64_t data_offset_ = 0;
    std::vector<GgufKeyValue> metadata_;
    std::map<std::string, size_t, std::less<>> key_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace qforge
