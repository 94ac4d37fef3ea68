#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.hpp"
#include "core/output_path.hpp"

namespace qforge {

namespace {

// Temporaries to remove if the process is interrupted. A signal handler may only use
// async-signal-safe calls, so the registry is a fixed array of C strings guarded by atomic flags.
constexpr int kMaxOpenOutputs = 32;
constexpr size_t kMaxPath = 4096;
char g_temp_paths[kMaxOpenOutputs][kMaxPath];
enum SlotState : int { kFree = 0, kClaimed = 1, kTempFile = 2, kTempDir = 3 };
std::atomic<int> g_slot_state[kMaxOpenOutputs];
std::atomic<uint64_t> g_temp_counter{0};
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};
// Threads inside a CleanupSignalsBlocked section (a temporary and its slot changing together),
// and a cleanup signal that arrived meanwhile on another thread (signal masks are per thread:
// a process-directed signal goes to any thread that does not block it). The handler defers such
// a signal; the last thread to leave its section raises it again.
std::atomic<int> g_critical{0};
std::atomic<int> g_deferred{0};

// Removes the files of a flat temporary directory, then the directory, with raw getdents64 (no
// malloc, unlike readdir). Unlinking while listing can skip entries, so it lists again until a
// pass finds nothing; another thread may still be writing into the directory while the handler
// runs, so listing and rmdir repeat until rmdir succeeds. Both a bounded number of times.
void remove_flat_dir_signal_safe(const char* path) {
    for (int attempt = 0; attempt < 16; ++attempt) {
        const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) return;
        alignas(8) char buf[4096];
        for (int pass = 0; pass < 16; ++pass) {
            bool removed = false;
            ::lseek(fd, 0, SEEK_SET);
            for (;;) {
                const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
                if (n <= 0) break;
                for (long off = 0; off < n;) {
                    // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, name.
                    unsigned short reclen;
                    std::memcpy(&reclen, buf + off + 16, sizeof reclen);
                    const char* name = buf + off + 19;
                    const bool dot =
                        name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
                    if (!dot && ::unlinkat(fd, name, 0) == 0) removed = true;
                    off += reclen;
                }
            }
            if (!removed) break;
        }
        ::close(fd);
        if (::rmdir(path) == 0 || errno != ENOTEMPTY) return;
    }
}

extern "C" void remove_temps_and_reraise(int sig) {
    if (g_critical.load() > 0) {  // a registry change is under way: clean up after it
        g_deferred.store(sig);
        return;
    }
    const int saved = errno;
    for (int i = 0; i < kMaxOpenOutputs; ++i)
        if (g_slot_state[i].load() == kTempFile) ::unlink(g_temp_paths[i]);
    for (int i = 0; i < kMaxOpenOutputs; ++i)
        if (g_slot_state[i].load() == kTempDir) remove_flat_dir_signal_safe(g_temp_paths[i]);
    errno = saved;
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

// Called by every constructor, so a handler reset to the default after the first output (a test
// harness restoring its own, a forked child that reset it) is installed again; a signal someone
// ignores (nohup) or handles otherwise is left to them.
void install_handlers() {
    for (int sig : kCleanupSignals) {
        struct sigaction old {};
        sigaction(sig, nullptr, &old);
        if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
        struct sigaction sa {};
        sa.sa_handler = remove_temps_and_reraise;
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, nullptr);
    }
    // A file-size limit (ulimit -f) should be an error from write(), not a killed process.
    static std::once_flag xfsz;
    std::call_once(xfsz, [] { std::signal(SIGXFSZ, SIG_IGN); });
}

// Holds SIGINT/SIGTERM/SIGHUP while a temporary's existence and its registry slot change
// together, so the handler never misses a temporary nor removes a name that is not ours.
class CleanupSignalsBlocked {
  public:
    CleanupSignalsBlocked() {
        sigset_t set;
        sigemptyset(&set);
        for (int sig : kCleanupSignals) sigaddset(&set, sig);
        pthread_sigmask(SIG_BLOCK, &set, &old_);
        g_critical.fetch_add(1);
    }
    ~CleanupSignalsBlocked() {
        const bool last = g_critical.fetch_sub(1) == 1;
        pthread_sigmask(SIG_SETMASK, &old_, nullptr);
        // A signal deferred by another thread's handler: handled now, the registry consistent.
        if (last)
            if (const int sig = g_deferred.exchange(0); sig != 0) std::raise(sig);
    }
    CleanupSignalsBlocked(const CleanupSignalsBlocked&) = delete;
    CleanupSignalsBlocked& operator=(const CleanupSignalsBlocked&) = delete;

  private:
    sigset_t old_;
};

int register_temp(const std::string& path, SlotState kind) {
    if (path.size() >= kMaxPath) return -1;
    for (int i = 0; i < kMaxOpenOutputs; ++i) {
        int expected = kFree;
        if (g_slot_state[i].compare_exchange_strong(expected, kClaimed)) {
            std::memcpy(g_temp_paths[i], path.c_str(), path.size() + 1);
            g_slot_state[i].store(kind);
            return i;
        }
    }
    return -1;
}

void unregister_temp(int& slot) {
    if (slot >= 0) g_slot_state[slot].store(kFree);
    slot = -1;
}

std::string parent_dir(const std::string& path) {
    const std::string parent = std::filesystem::path(path).parent_path().string();
    return parent.empty() ? "." : parent;
}

// A unique hidden name beside `final_path` for this process.
std::string temp_name_for(const std::string& final_path) {
    const std::filesystem::path p(final_path);
    std::string base = p.filename().string().substr(0, 200);  // room for the suffix in NAME_MAX
    const std::string name = "." + base + ".qforge-tmp." + std::to_string(::getpid()) + "." +
                             std::to_string(g_temp_counter.fetch_add(1));
    return (p.parent_path() / name).string();
}

// Empty when `path` may be replaced by a file: it does not exist, is a regular file, or is a
// symlink (replaced itself, its target untouched) that does not lead to something else.
// Otherwise what it is.
std::string not_replaceable(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return {};
    if (S_ISREG(st.st_mode)) return {};
    if (S_ISLNK(st.st_mode)) {
        if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return {};
        return "a symbolic link to " + file_kind(st.st_mode);
    }
    return file_kind(st.st_mode);
}

[[noreturn]] void refuse_to_replace(const std::string& path, const std::string& what) {
    throw Error(path, {}, "exists and is " + what + ": refusing to write over it");
}

// Makes a rename or link in `dir` durable. Some filesystems cannot fsync a directory (EINVAL):
// nothing more can be done there, and the data itself was fsynced.
int fsync_dir(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno;
    int err = 0;
    if (::fsync(fd) != 0 && errno != EINVAL) err = errno;
    ::close(fd);
    return err;
}

std::string cannot_create(const std::string& dir, int err) {
    if (err == ENOENT)
        return "cannot create the output file: its directory '" + dir + "' does not exist";
    return "cannot create the output file: " + errno_text(err);
}

constexpr size_t kBufferSize = 1 << 20;

}  // namespace

AtomicFile::AtomicFile(std::string final_path)
    : final_path_(std::move(final_path)), dir_(parent_dir(final_path_)) {
    install_handlers();
    if (const std::string what = not_replaceable(final_path_); !what.empty())
        refuse_to_replace(final_path_, what);

    // QFORGE_NO_O_TMPFILE (any value) takes the fallback path, so tests cover it everywhere.
    const bool use_tmpfile = std::getenv("QFORGE_NO_O_TMPFILE") == nullptr;
    errno = EOPNOTSUPP;
    if (use_tmpfile) fd_ = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ >= 0) {
        // Linking it needs /proc/self/fd (or CAP_DAC_READ_SEARCH for AT_EMPTY_PATH): without
        // /proc, use a named temporary rather than find out at commit time.
        const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
        if (::access(proc.c_str(), F_OK) != 0) {
            ::close(fd_);
            fd_ = -1;
        }
    } else if (const int err = errno; err != EOPNOTSUPP && err != EISDIR && err != EINVAL) {
        throw Error(final_path_, {}, cannot_create(dir_, err));
    }
    if (fd_ < 0) {
        CleanupSignalsBlocked blocked;
        for (int attempt = 0; fd_ < 0; ++attempt) {
            temp_path_ = temp_name_for(final_path_);
            fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            const int err = errno;
            if (fd_ < 0 && (err != EEXIST || attempt > 100))
                throw Error(final_path_, {}, cannot_create(dir_, err));
        }
        slot_ = register_temp(temp_path_, kTempFile);
    }
    buffer_.reserve(kBufferSize);
}

AtomicFile::~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    CleanupSignalsBlocked blocked;
    if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
    unregister_temp(slot_);
}

void AtomicFile::fail(const char* what, int err) {
    throw Error(final_path_, {}, std::string(what) + ": " + errno_text(err));
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

bool AtomicFile::link_to(const std::string& path) {
    const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
    if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) == 0)
        return true;
    const int err = errno;
    if (err != EEXIST && ::linkat(fd_, "", AT_FDCWD, path.c_str(), AT_EMPTY_PATH) == 0) return true;
    errno = err;
    return false;
}

// Renames the complete temporary `temp` over the target after checking, as late as possible,
// that the target is still something a file may replace. Removes `temp` on failure.
void AtomicFile::replace_target_with(const std::string& temp) {
    if (const std::string what = not_replaceable(final_path_); !what.empty()) {
        ::unlink(temp.c_str());
        refuse_to_replace(final_path_, what);
    }
    if (::rename(temp.c_str(), final_path_.c_str()) != 0) {
        const int err = errno;
        ::unlink(temp.c_str());
        fail("cannot move the finished file into place", err);
    }
}

void AtomicFile::commit() {
    flush();
    if (::fsync(fd_) != 0) fail("fsync failed", errno);
    if (anonymous()) {
        bool linked = false;
        if (not_replaceable(final_path_).empty() && ::access(final_path_.c_str(), F_OK) != 0) {
            // Nothing there: link the finished inode under its name, with no window at all.
            linked = link_to(final_path_);
            if (!linked && errno != EEXIST) fail("cannot create the output file", errno);
        }
        if (!linked) {
            // A file is there: link under a temporary name, then rename over it atomically.
            CleanupSignalsBlocked blocked;
            std::string temp;
            for (int attempt = 0;; ++attempt) {
                temp = temp_name_for(final_path_);
                if (link_to(temp)) break;
                if (errno != EEXIST || attempt > 100) fail("cannot create the output file", errno);
            }
            slot_ = register_temp(temp, kTempFile);
            replace_target_with(temp);
            unregister_temp(slot_);
        }
        // The data is fsynced and linked; a failing close cannot lose it.
        ::close(fd_);
        fd_ = -1;
    } else {
        if (::close(fd_) != 0) {
            fd_ = -1;
            fail("close failed", errno);
        }
        fd_ = -1;
        CleanupSignalsBlocked blocked;
        replace_target_with(temp_path_);
        unregister_temp(slot_);
    }
    committed_ = true;
    if (const int err = fsync_dir(dir_); err != 0)
        fail("fsync of its directory failed (the file is in place)", err);
}

AtomicDirectory::AtomicDirectory(std::string final_path) {
    install_handlers();
    std::filesystem::path p(final_path);
    while (!p.has_filename() && p.has_relative_path()) p = p.parent_path();  // "out/" -> "out"
    final_path_ = p.string();
    struct stat st {};
    if (::lstat(final_path_.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
        throw Error(final_path_, {},
                    "exists and is " +
                        (S_ISREG(st.st_mode)   ? std::string("a regular file")
                         : S_ISLNK(st.st_mode) ? std::string("a symbolic link")
                                               : file_kind(st.st_mode)) +
                        ", not a directory: refusing to replace it");
    CleanupSignalsBlocked blocked;
    for (int attempt = 0;; ++attempt) {
        temp_path_ = temp_name_for(final_path_);
        if (::mkdir(temp_path_.c_str(), 0755) == 0) break;
        const int err = errno;
        if (err != EEXIST || attempt > 100) {
            temp_path_.clear();
            throw Error(final_path_, {},
                        err == ENOENT ? "cannot create the output directory: its parent '" +
                                            parent_dir(final_path_) + "' does not exist"
                                      : "cannot create the output directory: " + errno_text(err));
        }
    }
    slot_ = register_temp(temp_path_, kTempDir);
}

AtomicDirectory::~AtomicDirectory() {
    if (!committed_ && !temp_path_.empty()) {
        CleanupSignalsBlocked blocked;
        std::error_code ec;
        std::filesystem::remove_all(temp_path_, ec);
    }
    unregister_temp(slot_);
}

void AtomicDirectory::commit() {
    if (const int err = fsync_dir(temp_path_); err != 0)
        throw Error(final_path_, {}, "fsync failed: " + errno_text(err));
    {
        CleanupSignalsBlocked blocked;
        // rename() replaces an empty directory atomically and refuses a non-empty one.
        if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
            const int err = errno;
            throw Error(final_path_, {},
                        err == ENOTEMPTY || err == EEXIST
                            ? std::string("exists and is not an empty directory")
                            : "cannot move the finished directory into place: " + errno_text(err));
        }
        committed_ = true;
        unregister_temp(slot_);
    }
    if (const int err = fsync_dir(parent_dir(final_path_)); err != 0)
        throw Error(
            final_path_, {},
            "fsync of its parent directory failed (the directory is in place): " + errno_text(err));
}

ScratchFile::ScratchFile(std::string path) : path_(std::move(path)) {
    install_handlers();
    CleanupSignalsBlocked blocked;
    slot_ = register_temp(path_, kTempFile);
}

ScratchFile::~ScratchFile() {
    CleanupSignalsBlocked blocked;
    ::unlink(path_.c_str());  // a mapping made from it stays valid
    unregister_temp(slot_);
}

}  // namespace qforge
