#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <algorithm>
#include <mutex>

#include "core/error.hpp"

namespace qforge {

namespace {

// Temporary files to remove if the process is interrupted. A signal handler may only use
// async-signal-safe calls, so the registry is a fixed array of C strings guarded by atomic flags.
constexpr int kMaxOpenOutputs = 16;
constexpr size_t kMaxPath = 4096;
char g_temp_paths[kMaxOpenOutputs][kMaxPath];
// 0: free, 1: claimed (path being written), 2: ready (the handler may unlink it).
std::atomic<int> g_slot_state[kMaxOpenOutputs];
std::once_flag g_handlers_installed;

extern "C" void remove_temps_and_reraise(int sig) {
    for (int i = 0; i < kMaxOpenOutputs; ++i)
        if (g_slot_state[i].load() == 2) ::unlink(g_temp_paths[i]);
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

void install_handlers() {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
        struct sigaction old {};
        sigaction(sig, nullptr, &old);
        if (old.sa_handler == SIG_IGN) continue;  // e.g. nohup: keep ignoring
        struct sigaction sa {};
        sa.sa_handler = remove_temps_and_reraise;
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, nullptr);
    }
    // A file-size limit (ulimit -f) should be an error from write(), not a killed process.
    std::signal(SIGXFSZ, SIG_IGN);
}

int register_temp(const std::string& path) {
    if (path.size() >= kMaxPath) return -1;
    for (int i = 0; i < kMaxOpenOutputs; ++i) {
        int expected = 0;
        if (g_slot_state[i].compare_exchange_strong(expected, 1)) {
            std::memcpy(g_temp_paths[i], path.c_str(), path.size() + 1);
            g_slot_state[i].store(2);
            return i;
        }
    }
    return -1;
}

void unregister_temp(int slot) {
    if (slot >= 0) g_slot_state[slot].store(0);
}

constexpr size_t kBufferSize = 1 << 20;

}  // namespace

AtomicFile::AtomicFile(std::string final_path) : final_path_(std::move(final_path)) {
    std::call_once(g_handlers_installed, install_handlers);
    temp_path_ = final_path_ + ".tmp." + std::to_string(::getpid());
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(final_path_, {}, "cannot create output file: " + errno_text(errno));
    slot_ = register_temp(temp_path_);
    buffer_.reserve(kBufferSize);
}

AtomicFile::~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_path_.c_str());
    unregister_temp(slot_);
}

void AtomicFile::fail(const std::string& what, int err) {
    throw Error(final_path_, {}, what + ": " + errno_text(err));
}

void AtomicFile::write_fully(const uint8_t* data, size_t size) {
    size_t done = 0;
    while (done < size) {
        ssize_t n = ::write(fd_, data + done, size - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            fail("write failed", errno);
        }
        done += static_cast<size_t>(n);
    }
}

void AtomicFile::flush() {
    write_fully(buffer_.data(), buffer_.size());
    buffer_.clear();
}

void AtomicFile::write(std::span<const uint8_t> bytes) {
    if (buffer_.size() + bytes.size() > kBufferSize) flush();
    if (bytes.size() >= kBufferSize) {
        write_fully(bytes.data(), bytes.size());
    } else {
        buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
    }
    position_ += bytes.size();
}

void AtomicFile::pad_to(uint64_t offset) {
    static const uint8_t zeros[4096] = {};
    if (offset < position_) throw Error(final_path_, {}, "internal error: pad_to moves backwards");
    while (position_ < offset) write(zeros, std::min<uint64_t>(sizeof zeros, offset - position_));
}

void AtomicFile::write_at(uint64_t offset, std::span<const uint8_t> bytes) {
    flush();
    size_t done = 0;
    while (done < bytes.size()) {
        ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                             static_cast<off_t>(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            fail("write failed", errno);
        }
        done += static_cast<size_t>(n);
    }
}

void AtomicFile::commit() {
    flush();
    if (::fsync(fd_) != 0) fail("fsync failed", errno);
    if (::close(fd_) != 0) {
        fd_ = -1;
        fail("close failed", errno);
    }
    fd_ = -1;
    if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) fail("rename failed", errno);
    committed_ = true;
}

}  // namespace qforge
