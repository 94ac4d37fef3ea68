#include "convert/qf_input.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>

#include "core/alloc.hpp"
#include "sources/detect.hpp"
#include "sources/model_source.hpp"

namespace qforge {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "qforge-";

// The process id in a conversion's name "qforge-<pid>-<n>-<input name>.qf", or 0.
pid_t owner_pid(const std::string& name) {
    if (name.rfind(kPrefix, 0) != 0 || !name.ends_with(".qf")) return 0;
    size_t i = std::char_traits<char>::length(kPrefix);
    long long pid = 0;
    const size_t start = i;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i - start < 9)
        pid = pid * 10 + (name[i++] - '0');
    if (i == start || i >= name.size() || name[i] != '-') return 0;
    return static_cast<pid_t>(pid);
}

// Conversions a killed process (SIGKILL: no handler runs) left behind: this user's files whose
// process no longer exists. A minute's age on top keeps a process in another pid namespace that
// shares the directory safe while it maps its fresh file (a mapped file may go: it stays valid).
void remove_stale_conversions(const fs::path& dir) {
    std::error_code ec;
    fs::directory_iterator it(dir, ec);
    if (ec) return;
    const auto now = fs::file_time_type::clock::now();
    for (const auto& entry : it) {
        const std::string name = entry.path().filename().string();
        const pid_t pid = owner_pid(name);
        struct stat st {};
        if (pid <= 0 || pid == ::getpid() || ::lstat(entry.path().c_str(), &st) != 0) continue;
        if (!S_ISREG(st.st_mode) || st.st_uid != ::getuid()) continue;
        if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
        const auto mtime = fs::last_write_time(entry.path(), ec);
        if (ec || now - mtime < std::chrono::minutes(1)) continue;
        fs::remove(entry.path(), ec);
    }
}

// A name of this process alone ("qforge-<pid>-<n>-<input name>.qf"): two commands converting
// the same input at once must not share a file.
std::string temporary_qf_path(const std::string& input) {
    static std::atomic<uint64_t> counter{0};
    const std::string base = fs::path(input).filename().string();
    return (fs::temp_directory_path() /
            (kPrefix + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
             (base.empty() ? std::string("model") : base) + ".qf"))
        .string();
}

}  // namespace

QfInput::QfInput(const std::string& input, const std::string& tokenizer) : path_(input) {
    if (detect_model_file(input).kind == ModelFileKind::qf && tokenizer.empty()) return;
    remove_stale_conversions(fs::temp_directory_path());
    scratch_ = std::make_unique<ScratchFile>(temporary_qf_path(input));
    ConvertOptions options;
    options.input = input;
    options.output = scratch_->path();
    options.tokenizer = tokenizer;
    report_ = naming_file_on_bad_alloc(input, [&] {
        const auto src = open_model_source(input, SourceOptions{.tokenizer = tokenizer});
        return convert_source(*src, options);
    });
    path_ = options.output;
}

}  // namespace qforge
