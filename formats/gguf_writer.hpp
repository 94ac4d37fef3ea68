// Writing GGUF files (the layout formats/gguf.hpp specifies and GgufFile reads back): metadata
// key/value pairs, tensor infos with offsets aligned to general.alignment, then the tensor data.
// The file appears under its path only when finish() succeeds (core/atomic_file.hpp); an Error
// or an interrupt leaves nothing behind.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/atomic_file.hpp"
#include "formats/gguf.hpp"

namespace qforge {

// Metadata values as the writer takes them (GgufValue's one-vector-per-kind form).
GgufValue gguf_u32(uint32_t v);
GgufValue gguf_f32(float v);
GgufValue gguf_bool(bool v);
GgufValue gguf_string(std::string v);
GgufValue gguf_string_array(std::vector<std::string> v);
GgufValue gguf_f32_array(std::vector<double> v);  // each value must be a float32
GgufValue gguf_i32_array(std::vector<int64_t> v);

class GgufWriter {
  public:
    // Checks the path as AtomicFile does; `alignment` is written as general.alignment.
    explicit GgufWriter(std::string path, uint32_t alignment = kGgufDefaultAlignment);

    // Metadata in the order added; a duplicate key or a value of the wrong shape is a logic error
    // (callers build them, files never do).
    void add(std::string key, GgufValue value);
    // A tensor info; `shape` in torch order ([rows, cols]), written reversed as ggml's ne. An
    // Error for a name over ggml's 63 bytes or a row that is not whole blocks of `type`.
    void add_tensor(const std::string& name, GgmlType type, std::span<const uint64_t> shape);

    // Then the data: every tensor once, in the order added, with exactly its byte size.
    void write_tensor(std::span<const uint8_t> bytes);
    void finish();

    uint64_t bytes_written() const { return out_.position(); }
    const std::string& path() const { return out_.final_path(); }

  private:
    void write_header();

    AtomicFile out_;
    uint32_t alignment_;
    std::vector<GgufKeyValue> metadata_;
    std::vector<GgufTensorInfo> tensors_;
    uint64_t data_bytes_ = 0;  // the data section so far, as planned by add_tensor
    uint64_t data_start_ = 0;  // absolute offset of the data section, once the header is out
    size_t next_tensor_ = 0;
    bool header_written_ = false;
};

}  // namespace qforge
