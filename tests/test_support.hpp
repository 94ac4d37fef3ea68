// Helpers shared by the tests: ../shared/data, the committed fixtures in tests/data, scratch
// directories, file bytes. Built as the library qforge_test_support, which needs core and
// formats only (no convert, tokenizer or CLI), so the CUDA tests of the GPU-check build link it
// too; the helpers that convert models or run the qforge binary are in cli_support.hpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "formats/qtype.hpp"

namespace qforge::test {

// tests/data/<relative>, a committed fixture. It must exist: a missing one means a broken
// checkout, not a machine without data, so this throws (the test fails) instead of skipping.
std::filesystem::path fixture(const std::filesystem::path& relative);

// ../shared/data beside the checkout (or $QFORGE_SHARED_DATA); nullopt when absent. It is
// read-only and never copied into the repository: tests that need it skip without it.
std::optional<std::filesystem::path> shared_data_dir();

// The first stories of <data>/tinystories-val-sample/tinystories_val_sample.txt (`data` is
// shared_data_dir()): its first 64 KiB cut back to just after the last blank line, 65,503
// bytes, which hold the first 16 512-token windows of ppl_ref.json. Tests that only need some
// in-domain text read this instead of the whole 794 KB file, to stay fast.
std::string tinystories_head(const std::filesystem::path& data);

// Prints "SKIPPED: <reason>" (ctest's skip marker) and returns from the test case.
#define QF_SKIP(reason)                                            \
    do {                                                           \
        std::printf("SKIPPED: %s\n", std::string(reason).c_str()); \
        std::fflush(stdout);                                       \
        return;                                                    \
    } while (0)

// The shared data folder, or skip the current test with a printed reason.
#define QF_REQUIRE_SHARED_DATA(var)                                               \
    auto var##_opt = ::qforge::test::shared_data_dir();                           \
    if (!var##_opt) QF_SKIP("../shared/data is absent (set QFORGE_SHARED_DATA)"); \
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
std::vector<std::string> files_containing(const std::filesystem::path& dir,
                                          const std::string& fragment);

// Values stored as f32, f16 or bf16 bytes (little-endian), as a tensor of that qtype holds them.
std::vector<uint8_t> float_bytes(QType t, const std::vector<float>& v);

// A matrix [rows][cols] of values as a tensor of type t holds it: float bytes, or each row through
// the reference quantizer (throws std::runtime_error if a row does not quantize).
std::vector<uint8_t> matrix_bytes(QType t, uint64_t rows, uint64_t cols,
                                  const std::vector<float>& v);

// Activations [n][k] with `latent` shared factors, noise, uneven channel scales and a few outlier
// channels: the correlated inputs of a real linear layer in miniature (GPTQ and refit tests).
std::vector<float> correlated_inputs(uint64_t n, uint64_t k, uint64_t latent, uint64_t seed);

// Activations [m][k] for kernel tests: standard normal, every 97th value 20 times larger (the
// outliers real activations have).
std::vector<float> kernel_activations(uint64_t m, uint64_t k, uint32_t seed);

// Every quantized type of formats/qtype.hpp's table, in table order.
inline std::vector<QType> quantized_types() {
    std::vector<QType> v;
    for (const auto& row : kQTypes)
        if (!row.is_float) v.push_back(row.type);
    return v;
}

}  // namespace qforge::test
