// Outputs that appear under their final name only when complete, and leave nothing behind when
// the work fails or the process is interrupted.
//
// AtomicFile writes into an unnamed file (O_TMPFILE) in the target's directory: until commit()
// it has no name at all, so even SIGKILL or a power cut leaves nothing. commit() fsyncs it, then
// links it under the final name when that is free; when a file is already there it links it
// under a unique hidden name (".<name>.qforge-tmp.<pid>.<n>") and renames that over the target,
// so the target is at every moment either the complete old file or the complete new one; then it
// fsyncs the directory. Where the filesystem has no O_TMPFILE (or /proc is not mounted), bytes
// go to the hidden temporary name from the start, as before; only SIGKILL can then leave it
// (QFORGE_NO_O_TMPFILE set in the environment forces this path, for tests).
// Nothing that is not a regular file (a device node, a FIFO, a directory, a symlink to one) is
// ever opened, truncated or renamed over: refused when the object is made and checked again
// just before the rename. Errors name the final path, never a temporary one.
//
// Cleanup: the destructor without commit() (an exception, a full disk) removes what exists; a
// SIGINT, SIGTERM or SIGHUP removes every temporary of the process (a fixed registry the signal
// handler reads) and then ends it with that signal as before.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace qforge {

class AtomicFile {
  public:
    // Throws qforge::Error naming final_path when it exists and is not a regular file, or when
    // its directory does not exist or is not writable.
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
    // True when the bytes go to an unnamed O_TMPFILE inode (nothing visible before commit).
    bool anonymous() const { return temp_path_.empty(); }

  private:
    void flush();
    void write_fully(const uint8_t* data, size_t size);
    [[noreturn]] void fail(const char* what, int err);
    bool link_to(const std::string& path);  // the O_TMPFILE inode under `path`; false + errno
    void replace_target_with(const std::string& temp);

    std::string final_path_;
    std::string dir_;        // the directory that holds final_path_
    std::string temp_path_;  // named fallback only: the hidden temporary
    int fd_ = -1;
    int slot_ = -1;  // index in the signal-cleanup registry
    uint64_t position_ = 0;
    std::vector<uint8_t> buffer_;
    bool committed_ = false;
};

// A directory output (export): files are written into a hidden temporary directory beside the
// target (".<name>.qforge-tmp.<pid>.<n>", files only, no subdirectories), which commit() fsyncs
// and renames into place (over an empty directory, or where nothing is). The destructor without
// commit() and SIGINT/SIGTERM/SIGHUP remove the temporary directory and everything in it. Parent
// directories are never created: a missing one is an error before anything is made.
class AtomicDirectory {
  public:
    explicit AtomicDirectory(std::string final_path);
    ~AtomicDirectory();
    AtomicDirectory(const AtomicDirectory&) = delete;
    AtomicDirectory& operator=(const AtomicDirectory&) = delete;

    // Where the files go until commit(). Internal: never show it to the user.
    const std::string& temp_path() const { return temp_path_; }
    const std::string& final_path() const { return final_path_; }
    void commit();

  private:
    std::string final_path_;
    std::string temp_path_;
    int slot_ = -1;
    bool committed_ = false;
};

// A named scratch file of this process that a command writes and then maps (a model converted
// for `ppl`, say): nothing is made here, but the path is removed when this object goes and, like
// every temporary above, on SIGINT/SIGTERM/SIGHUP. Only SIGKILL can leave it behind; the name
// should carry the process id so that a later run can tell such leftovers (convert/qf_input).
class ScratchFile {
  public:
    explicit ScratchFile(std::string path);
    ~ScratchFile();
    ScratchFile(const ScratchFile&) = delete;
    ScratchFile& operator=(const ScratchFile&) = delete;
    const std::string& path() const { return path_; }

  private:
    std::string path_;
    int slot_ = -1;
};

}  // namespace qforge
