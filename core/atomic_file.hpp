// An output file that appears under its final name only when complete. Bytes go to a temporary
// file beside the target ("<name>.tmp.<pid>"); commit() flushes, fsyncs and renames it. If the
// object is destroyed without commit() (an exception, a full disk) or the process gets
// SIGINT/SIGTERM/SIGHUP, the temporary file is removed, so no partial output is ever left.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace qforge {

class AtomicFile {
public:
    explicit AtomicFile(std::string final_path);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(std::span<const uint8_t> bytes);
    void write(const void* data, uint64_t size) {
        write({static_cast<const uint8_t*>(data), static_cast<size_t>(size)});
    }
    // Zero bytes up to `offset` (an absolute position not before the current one).
    void pad_to(uint64_t offset);
    // Overwrites bytes already written (e.g. a header whose fields are known only at the end).
    void write_at(uint64_t offset, std::span<const uint8_t> bytes);
    uint64_t position() const { return position_; }

    void commit();

    const std::string& final_path() const { return final_path_; }
    const std::string& temp_path() const { return temp_path_; }

private:
    void flush();
    void write_fully(const uint8_t* data, size_t size);
    [[noreturn]] void fail(const std::string& what, int err);

    std::string final_path_;
    std::string temp_path_;
    int fd_ = -1;
    int slot_ = -1;  // index in the signal-cleanup registry
    uint64_t position_ = 0;
    std::vector<uint8_t> buffer_;
    bool committed_ = false;
};

}  // namespace qforge
