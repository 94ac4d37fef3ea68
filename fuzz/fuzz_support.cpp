#include "fuzz/fuzz_support.hpp"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <system_error>

namespace qforge::fuzz {

namespace fs = std::filesystem;

std::vector<std::string_view> split_files(const uint8_t* data, size_t size, size_t parts) {
    std::string_view all(reinterpret_cast<const char*>(data), size);
    std::vector<std::string_view> out;
    while (out.size() + 1 < parts) {
        size_t at = all.find(kFileSeparator);
        if (at == std::string_view::npos) break;
        out.push_back(all.substr(0, at));
        all.remove_prefix(at + kFileSeparator.size());
    }
    out.push_back(all);
    out.resize(parts);
    return out;
}

namespace {

fs::path make_scratch_dir() {
    std::error_code ec;
    fs::path base = "/dev/shm";
    if (access(base.c_str(), W_OK) != 0) {
        const char* tmp = std::getenv("TMPDIR");
        base = tmp && *tmp ? tmp : "/tmp";
    }
    std::string pattern = (base / "qforge-fuzz-XXXXXX").string();
    if (!mkdtemp(pattern.data())) {
        std::perror("qforge-fuzz: mkdtemp");
        std::abort();
    }
    return pattern;
}

struct ScratchDir {
    fs::path path = make_scratch_dir();
    ~ScratchDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

}  // namespace

const fs::path& scratch_dir() {
    static ScratchDir dir;
    return dir.path;
}

std::string write_file(const std::string& name, std::string_view bytes) {
    fs::path p = scratch_dir() / name;
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
        std::fprintf(stderr, "qforge-fuzz: cannot write %s\n", p.c_str());
        std::abort();
    }
    return p.string();
}

void clear_scratch() {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(scratch_dir(), ec))
        fs::remove_all(entry.path(), ec);
}

bool verbose() {
    static const bool on = std::getenv("QFORGE_FUZZ_VERBOSE") != nullptr;
    return on;
}

std::string fixture(const std::string& relative) {
    return std::string(QFORGE_SOURCE_DIR) + "/tests/data/" + relative;
}

std::string read_fixture(const std::string& relative) {
    std::ifstream in(fixture(relative), std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "qforge-fuzz: cannot read fixture %s\n", fixture(relative).c_str());
        std::abort();
    }
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace qforge::fuzz
