#include "core/output_path.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "core/error.hpp"

namespace qforge {

namespace {

namespace fs = std::filesystem;

struct FileId {
    dev_t dev;
    ino_t ino;
    bool operator==(const FileId&) const = default;
};

std::optional<struct stat> stat_following(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::nullopt;
    return st;
}

FileId id_of(const struct stat& st) { return {st.st_dev, st.st_ino}; }

// The directory that holds `p` as the kernel resolves it ("" for a bare name is ".").
std::string parent_of(const fs::path& p) {
    const fs::path parent = p.parent_path();
    return parent.empty() ? std::string(".") : parent.string();
}

// Whether `dir` is `path` itself or one of its ancestors, by inode, after resolving symlinks: a
// path that does not exist yet is placed by its parent directory, which must exist.
bool within(const std::string& path, const FileId& dir) {
    char resolved[PATH_MAX];
    fs::path cur;
    if (::realpath(path.c_str(), resolved))
        cur = resolved;
    else if (::realpath(parent_of(fs::path(path)).c_str(), resolved))
        cur = resolved;
    else
        return false;
    for (;;) {
        if (auto st = stat_following(cur.string()); st && id_of(*st) == dir) return true;
        if (cur == cur.parent_path() || cur.parent_path().empty()) return false;
        cur = cur.parent_path();
    }
}

// `path` with its directory resolved (symlinks, "..") and its last component kept, for paths
// that may not exist yet; empty when the directory cannot be resolved.
std::string resolved(const fs::path& path) {
    char buf[PATH_MAX];
    if (!::realpath(parent_of(path).c_str(), buf)) return {};
    return (fs::path(buf) / path.filename()).string();
}

// `p` with trailing '/' removed, so "out/" names the directory "out".
fs::path without_trailing_slash(const std::string& p) {
    fs::path path(p);
    while (!path.has_filename() && path.has_relative_path()) path = path.parent_path();
    return path;
}

void require_parent_directory(const std::string& what, const fs::path& path) {
    const std::string parent = parent_of(path);
    struct stat st {};
    if (::stat(parent.c_str(), &st) != 0) {
        const int err = errno;
        throw Error(what, {},
                    "cannot write here: its directory '" + parent + "' " +
                        (err == ENOENT ? std::string("does not exist")
                                       : "cannot be examined: " + errno_text(err)) +
                        " (qforge does not create directories)");
    }
    if (!S_ISDIR(st.st_mode))
        throw Error(what, {}, "cannot write here: '" + parent + "' is not a directory");
}

}  // namespace

std::string file_kind(mode_t mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

void check_output_path(const std::string& output, const std::vector<std::string>& inputs,
                       OutputKind kind) {
    if (output.empty())
        throw Error("the output path is empty: name the " +
                    std::string(kind == OutputKind::file ? "file" : "directory") +
                    " to write with -o");
    const fs::path out =
        kind == OutputKind::directory ? without_trailing_slash(output) : fs::path(output);
    const std::string name = out.filename().string();
    if (kind == OutputKind::file && (name.empty() || name == "." || name == ".."))
        throw Error(output, {}, "names a directory, not an output file");
    require_parent_directory(output, out);

    const std::optional<struct stat> existing = stat_following(out.string());
    // The input first: "is the input" says more than "is a regular file, not a directory".
    for (const std::string& input : inputs) {
        const std::optional<struct stat> in = stat_following(input);
        if (in && existing && id_of(*existing) == id_of(*in))
            throw Error(output, {},
                        "is the input '" + input +
                            "' (the same file, perhaps through a link): refusing to overwrite "
                            "an input; write to another path");
    }
    if (existing && kind == OutputKind::file && !S_ISREG(existing->st_mode))
        throw Error(output, {},
                    "exists and is " + file_kind(existing->st_mode) +
                        ": refusing to write over it (name a regular file or a new path)");
    if (existing && kind == OutputKind::directory && !S_ISDIR(existing->st_mode))
        throw Error(output, {},
                    "exists and is " + file_kind(existing->st_mode) +
                        ", not a directory: refusing to replace it");
    for (const std::string& input : inputs) {
        const std::optional<struct stat> in = stat_following(input);
        if (!in) continue;  // a missing input is the reader's error to report
        if (S_ISDIR(in->st_mode) && within(out.string(), id_of(*in)))
            throw Error(output, {},
                        "is inside the input directory '" + input +
                            "': refusing to write into an input; write to another directory");
        if (kind == OutputKind::directory && existing && within(input, id_of(*existing)))
            throw Error(output, {}, "contains the input '" + input + "': refusing to replace it");
    }
    if (existing && kind == OutputKind::directory) {
        std::error_code ec;
        if (!fs::is_empty(out, ec) || ec)
            throw Error(output, {}, "exists and is not an empty directory");
    }
}

void check_state_dir(const std::string& dir, const std::string& output,
                     const std::vector<std::string>& inputs) {
    if (dir.empty()) return;
    const fs::path path = without_trailing_slash(dir);
    require_parent_directory(dir, path);
    const std::optional<struct stat> existing = stat_following(path.string());
    if (existing && !S_ISDIR(existing->st_mode))
        throw Error(
            dir, {},
            "--resume: exists and is " + file_kind(existing->st_mode) + ", not a directory");
    // By inode when the directory exists; by resolved path when it is still to be made.
    const std::string dir_path = resolved(path), out_path = resolved(fs::path(output));
    const bool output_inside =
        !output.empty() && (existing ? within(output, id_of(*existing))
                                     : !dir_path.empty() && (out_path == dir_path ||
                                                             out_path.starts_with(dir_path + "/")));
    if (output_inside)
        throw Error(dir, {},
                    "--resume: the output '" + output +
                        "' is this directory or inside it: keep the state apart from the output");
    for (const std::string& input : inputs) {
        const std::optional<struct stat> in = stat_following(input);
        if (!in) continue;
        if (S_ISDIR(in->st_mode) && within(path.string(), id_of(*in)))
            throw Error(dir, {},
                        "--resume: is the input directory '" + input +
                            "' or inside it: keep the state apart from the inputs");
        if (existing && within(input, id_of(*existing)))
            throw Error(
                dir, {},
                "--resume: holds the input '" + input + "': keep the state apart from the inputs");
    }
}

}  // namespace qforge
