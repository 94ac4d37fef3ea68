#include "core/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "core/error.hpp"

namespace qforge {

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path_, {}, "cannot open: " + errno_text(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        throw Error(path_, {}, "cannot stat: " + errno_text(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(path_, {}, "not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            throw Error(path_, {},
                        "cannot mmap " + std::to_string(size_) + " bytes: " + errno_text(err));
        }
        data_ = static_cast<uint8_t*>(p);
    }
    ::close(fd);  // the mapping keeps the file referenced
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(data_, size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        if (data_) ::munmap(data_, size_);
        path_ = std::move(other.path_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

void MappedFile::release(uint64_t offset, uint64_t length) const {
    if (!data_ || offset >= size_) return;
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t begin = offset / page * page;
    uint64_t end = std::min(size_, offset + length);
    if (end > begin) ::madvise(data_ + begin, end - begin, MADV_DONTNEED);
}

}  // namespace qforge
