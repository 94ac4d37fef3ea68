#include "sources/source_common.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "formats/qf_validate.hpp"
#include "tokenizer/source.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

json source_entry(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path, {}, "cannot open: " + errno_text(errno));
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    Xxh3Stream128 h;
    std::vector<uint8_t> buf(4 << 20);
    uint64_t total = 0;
    for (;;) {
        ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            ::close(fd);
            throw Error(path, {}, "read failed: " + errno_text(err));
        }
        if (n == 0) break;
        h.update({buf.data(), static_cast<size_t>(n)});
        total += static_cast<uint64_t>(n);
    }
    ::close(fd);
    // Only the file name: absolute paths would make identical inputs give different files.
    return {{"file", fs::path(path).filename().string()}, {"bytes", total}, {"hash", h.digest()}};
}

json resolve_tokenizer(const std::string& given, const std::optional<std::string>& found,
                       const std::string& input, const ModelConfig& config,
                       std::string& tokenizer_file, std::vector<std::string>& warnings) {
    const std::string path = given.empty() ? found.value_or("") : given;
    if (path.empty()) {
        warnings.push_back("no tokenizer found beside " + input +
                           "; the .qf will have none (pass --tokenizer FILE)");
        return nullptr;
    }
    tokenizer_file = path;
    json tokenizer = load_tokenizer_source(path);
    if (const uint64_t without = check_tokenizer_fits_model(tokenizer, config, path, input))
        warnings.push_back(path + " has " + std::to_string(config.vocab_size - without) +
                           " tokens for " + std::to_string(config.vocab_size) +
                           " embedding rows: " + std::to_string(without) +
                           " ids have no token (padding rows) and are never generated");
    return tokenizer;
}

namespace {

// Within each head, row 2i + j of the adjacent-pair layout is row j * (head_dim/2) + i of the
// rotate-half layout; `to_halves` picks the direction.
void permute_rope_rows(std::span<const uint8_t> in, std::span<uint8_t> out, uint64_t n_heads,
                       uint64_t head_dim, uint64_t row_bytes, bool to_halves) {
    if (head_dim % 2 != 0 || in.size() != out.size() || in.size() != n_heads * head_dim * row_bytes)
        throw std::logic_error("permute_rope_rows: inconsistent sizes");
    const uint64_t half = head_dim / 2;
    for (uint64_t h = 0; h < n_heads; ++h)
        for (uint64_t j = 0; j < 2; ++j)
            for (uint64_t i = 0; i < half; ++i) {
                const uint64_t pairs = h * head_dim + 2 * i + j,
                               halves = h * head_dim + j * half + i;
                const uint64_t src = to_halves ? pairs : halves, dst = to_halves ? halves : pairs;
                std::memcpy(out.data() + dst * row_bytes, in.data() + src * row_bytes, row_bytes);
            }
}

}  // namespace

void permute_rope_pairs_to_halves(std::span<const uint8_t> in, std::span<uint8_t> out,
                                  uint64_t n_heads, uint64_t head_dim, uint64_t row_bytes) {
    permute_rope_rows(in, out, n_heads, head_dim, row_bytes, true);
}

void permute_rope_halves_to_pairs(std::span<const uint8_t> in, std::span<uint8_t> out,
                                  uint64_t n_heads, uint64_t head_dim, uint64_t row_bytes) {
    permute_rope_rows(in, out, n_heads, head_dim, row_bytes, false);
}

void check_layers_fit(uint64_t num_layers, uint64_t tensor_count, const std::string& file,
                      const std::string& what) {
    if (num_layers > tensor_count)
        throw Error(file, {},
                    what + " is " + std::to_string(num_layers) + " but the checkpoint holds only " +
                        std::to_string(tensor_count) + " tensors (every layer has its own)");
}

}  // namespace qforge
