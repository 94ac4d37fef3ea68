// A whole file mapped read-only into memory. Tensors are used in place from the mapping, so the
// page cache holds the weights once and conversion streams with a footprint near one tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace qforge {

class MappedFile {
  public:
    // Throws qforge::Error naming the path when the file cannot be opened or mapped.
    explicit MappedFile(std::string path);
    ~MappedFile();
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const std::string& path() const { return path_; }
    uint64_t size() const { return size_; }
    const uint8_t* data() const { return data_; }
    std::span<const uint8_t> bytes() const { return {data_, static_cast<size_t>(size_)}; }

    // Tells the kernel a range is no longer needed, so streaming over a file larger than memory
    // does not push other pages out. Harmless if it fails.
    void release(uint64_t offset, uint64_t length) const;

  private:
    std::string path_;
    uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
};

}  // namespace qforge
