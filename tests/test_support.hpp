// Helpers shared by the tests: locating ../shared/data, scratch directories, running the CLI.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "formats/qtype.hpp"

namespace qforge::test {

// ../shared/data beside the checkout (or $QFORGE_SHARED_DATA); nullopt when absent.
std::optional<std::filesystem::path> shared_data_dir();

// Prints "SKIPPED: <reason>" (ctest's skip marker) and returns from the test case.
#define QF_SKIP(reason)                                      \
    do {                                                     \
        std::printf("SKIPPED: %s\n", std::string(reason).c_str()); \
        std::fflush(stdout);                                 \
        return;                                              \
    } while (0)

// The shared data folder, or skip the current test with a printed reason.
#define QF_REQUIRE_SHARED_DATA(var)                                                   \
    auto var##_opt = ::qforge::test::shared_data_dir();                               \
    if (!var##_opt) QF_SKIP("../shared/data is absent (set QFORGE_SHARED_DATA)");    \
    const std::filesystem::path var = *var##_opt

// A fresh empty directory under the build tree, removed when the object dies.
class ScratchDir {
public:
    explicit ScratchDir(const std::string& name);
    ~ScratchDir();
    const std::filesystem::path& path() const { return path_; }
    std::filesystem::path operator/(const std::string& child) const { return path_ / child; }

private:
    std::filesystem::path path_;
};

void write_file(const std::filesystem::path& p, const std::vector<uint8_t>& bytes);
void write_file(const std::filesystem::path& p, const std::string& text);
std::vector<uint8_t> read_file(const std::filesystem::path& p);

// Names of the files in `dir` that contain `fragment` (".qf" finds outputs and their temporaries):
// tests of failed writes require it to be empty.
std::vector<std::string> files_containing(const std::filesystem::path& dir, const std::string& fragment);

// Values stored as f32, f16 or bf16 bytes (little-endian), as a tensor of that qtype holds them.
std::vector<uint8_t> float_bytes(QType t, const std::vector<float>& v);

// Converts <data>/stories260K/<variant> ("hf" or "hf-fp16") with its tok512.bin into
// <dir>/<variant>.qf and returns that path.
std::filesystem::path convert_stories(const std::filesystem::path& data, const std::string& variant,
                                      const ScratchDir& dir);

// Every quantized type of formats/qtype.hpp's table, in table order.
inline std::vector<QType> quantized_types() {
    std::vector<QType> v;
    for (const auto& row : kQTypes)
        if (!row.is_float) v.push_back(row.type);
    return v;
}

struct CommandResult {
    int exit_code;
    std::string output;  // stdout and stderr together
};
// Runs the qforge binary with the given argument string (shell-quoted by the caller), after
// `shell_prefix` (e.g. "ulimit -f 100;").
CommandResult run_qforge(const std::string& args, const std::string& shell_prefix = "");

}  // namespace qforge::test
