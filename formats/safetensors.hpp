// safetensors: the Hugging Face checkpoint format we convert from.
//
// Layout of one file (all integers little-endian):
//   [0, 8)          u64 N: length of the header in bytes
//   [8, 8 + N)      UTF-8 JSON object. Each tensor: name -> {"dtype": "F32", "shape": [2, 3],
//                   "data_offsets": [begin, end]}, offsets relative to the data section. An
//                   optional "__metadata__" entry maps strings to strings. Writers pad the JSON
//                   with spaces so N is a multiple of 8 (tensor data then starts 8-aligned).
//   [8 + N, EOF)    the data section: each tensor's bytes, row-major, dense.
//
// A checkpoint is one such file, or several shards named by model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor name: shard file name}}).
//
// Files are untrusted: the reader checks every length, offset and product in 64 bits before any
// byte is touched, and every failure is a qforge::Error naming the file and tensor. Tensor bytes
// are views into a read-only mapping; a view is aligned only as far as the file aligns it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.hpp"
#include "formats/dtype.hpp"

namespace qforge {

// The reference implementation refuses headers larger than this; so do we, before parsing.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsTensorInfo {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
    uint64_t begin,
        end;  // byte offsets relative to the start of the data section (after the header)
};

class SafetensorsFile {
  public:
    explicit SafetensorsFile(
        const std::string& path);  // mmap + validate everything; throws qforge::Error

    const std::string& path() const { return mapped_.path(); }
    const std::vector<SafetensorsTensorInfo>& tensors() const {
        return tensors_;
    }                                                                // sorted by begin
    const SafetensorsTensorInfo* find(std::string_view name) const;  // nullptr if absent
    TensorView view(const SafetensorsTensorInfo& t) const;           // span into the mapping
    const std::map<std::string, std::string>& metadata() const {
        return metadata_;
    }                                                    // "__metadata__"
    void release(const SafetensorsTensorInfo& t) const;  // MappedFile::release of its bytes

    // Absolute file offset of the data section: 8 + header length.
    uint64_t data_offset() const { return data_offset_; }

  private:
    void parse_header();

    MappedFile mapped_;
    uint64_t data_offset_ = 0;
    std::vector<SafetensorsTensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> by_name_;  // index into tensors_
    std::map<std::string, std::string> metadata_;
};

class SafetensorsCheckpoint {
  public:
    // `path`: a single .safetensors file; or a directory holding model.safetensors.index.json
    // (sharded, the index's "weight_map" decides which shard holds each tensor) or else
    // model.safetensors. Anything else is an Error that says what the directory does hold.
    explicit SafetensorsCheckpoint(const std::string& path);

    // Shard paths: the index's shard file names in sorted order (model-00001-of-0000N first),
    // or the one file.
    const std::vector<std::string>& files() const { return files_; }
    std::vector<std::string> tensor_names() const;  // shard order, then offset order
    bool contains(std::string_view name) const;
    const SafetensorsTensorInfo* find(std::string_view name) const;  // nullptr if absent
    TensorView tensor(std::string_view name) const;  // throws Error naming the tensor if absent
    const std::string& file_of(std::string_view name) const;
    void release(std::string_view name) const;
    uint64_t total_tensor_bytes() const;

  private:
    struct Location {
        size_t shard;
        const SafetensorsTensorInfo* info;  // owned by shards_[shard], which never moves
    };
    const Location& locate(std::string_view name) const;
    void open_sharded(const std::string& index_path, const std::string& dir);

    std::vector<std::string> files_;
    std::vector<std::unique_ptr<SafetensorsFile>> shards_;
    std::map<std::string, Location, std::less<>> locations_;
};

// Writes a safetensors file through AtomicFile (temp + rename). Header JSON: each tensor
// {"dtype","shape","data_offsets"}, optional "__metadata__" (string->string) first; header padded
// with spaces to a multiple of 8 bytes as the reference implementation does; tensors laid out in
// the given order. Throws Error for a duplicate or reserved name, or bytes that do not match the
// shape.
void write_safetensors(const std::string& path, std::span<const TensorView> tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace qforge
