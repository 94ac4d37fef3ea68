#include "test_support.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>

#include "core/half.hpp"

namespace qforge::test {

namespace fs = std::filesystem;

fs::path fixture(const fs::path& relative) {
    const fs::path p = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / relative;
    if (!fs::exists(p))
        throw std::runtime_error("the committed test fixture " + p.string() +
                                 " is missing: restore tests/data from git");
    return p;
}

std::optional<fs::path> shared_data_dir() {
    if (const char* env = std::getenv("QFORGE_SHARED_DATA")) {
        if (fs::is_directory(env)) return fs::path(env);
        return std::nullopt;
    }
    fs::path p = fs::path(QFORGE_SOURCE_DIR) / ".." / "shared" / "data";
    if (fs::is_directory(p)) return fs::canonical(p);
    return std::nullopt;
}

std::string tinystories_head(const fs::path& data) {
    const fs::path p = data / "tinystories-val-sample" / "tinystories_val_sample.txt";
    std::ifstream f(p, std::ios::binary);
    std::string text(65536, '\0');
    f.read(text.data(), static_cast<std::streamsize>(text.size()));
    if (f.gcount() != static_cast<std::streamsize>(text.size()))
        throw std::runtime_error("cannot read the first 64 KiB of " + p.string());
    // Whole stories only: cut after the last blank line, as a story ends.
    const size_t end = text.rfind("\n\n");
    if (end == std::string::npos) throw std::runtime_error("no blank line in " + p.string());
    text.resize(end + 2);
    return text;
}

ScratchDir::ScratchDir(const std::string& name) {
    path_ = fs::temp_directory_path() / ("qforge-test-" + name + "-" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
}

ScratchDir::~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
}

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    if (!f) throw std::runtime_error("cannot write " + p.string());
}

void write_file(const fs::path& p, const std::string& text) {
    write_file(p, std::vector<uint8_t>(text.begin(), text.end()));
}

std::vector<uint8_t> read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + p.string());
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<std::string> files_containing(const fs::path& dir, const std::string& fragment) {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name.find(fragment) != std::string::npos) found.push_back(name);
    }
    return found;
}

std::vector<uint8_t> matrix_bytes(QType t, uint64_t rows, uint64_t cols,
                                  const std::vector<float>& v) {
    if (!qtype_is_quantized(t)) return float_bytes(t, v);
    const uint64_t stride = *qtype_row_bytes(t, cols);
    std::vector<uint8_t> out(rows * stride);
    for (uint64_t r = 0; r < rows; ++r)
        if (quantize_row_ref(t, v.data() + r * cols, cols, out.data() + r * stride) !=
            QuantStatus::ok)
            throw std::runtime_error("matrix_bytes: row " + std::to_string(r) +
                                     " does not quantize");
    return out;
}

std::vector<uint8_t> float_bytes(QType t, const std::vector<float>& v) {
    std::vector<uint8_t> out;
    for (float f : v) {
        if (t == QType::f32) {
            const auto* p = reinterpret_cast<const uint8_t*>(&f);
            out.insert(out.end(), p, p + 4);
        } else {
            const uint16_t h = t == QType::f16 ? f32_to_f16(f) : f32_to_bf16(f);
            out.push_back(static_cast<uint8_t>(h & 0xff));
            out.push_back(static_cast<uint8_t>(h >> 8));
        }
    }
    return out;
}

std::vector<float> correlated_inputs(uint64_t n, uint64_t k, uint64_t latent, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal;
    std::vector<double> mix(latent * k), channel(k);
    for (auto& m : mix) m = normal(rng) / std::sqrt(static_cast<double>(latent));
    for (auto& c : channel) c = std::exp(0.5 * normal(rng));
    for (uint64_t c = 0; c < k; c += 37) channel[c] *= 6.0;
    std::vector<float> x(n * k);
    std::vector<double> z(latent);
    for (uint64_t t = 0; t < n; ++t) {
        for (auto& v : z) v = normal(rng);
        for (uint64_t c = 0; c < k; ++c) {
            double v = 0.5 * normal(rng);
            for (uint64_t l = 0; l < latent; ++l) v += z[l] * mix[l * k + c];
            x[t * k + c] = static_cast<float>(v * channel[c]);
        }
    }
    return x;
}

std::vector<float> kernel_activations(uint64_t m, uint64_t k, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(m * k);
    for (auto& v : x) v = dist(rng);
    for (uint64_t i = 0; i < x.size(); i += 97) x[i] *= 20.0f;
    return x;
}

}  // namespace qforge::test
