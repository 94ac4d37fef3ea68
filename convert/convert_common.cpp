#include "convert/convert_common.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "core/error.hpp"
#include "core/hash.hpp"
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

json convert_provenance(json sources, const ConvertOptions& options, const json& recipe_extra) {
    json recipe = {
        {"command", "convert"},
        {"dtype", options.dtype ? std::string(qtype_traits(*options.dtype).name) : "source"},
        {"compress", options.compress}};
    recipe.update(recipe_extra);
    return {
        {"generator", {{"name", "qforge"}, {"version", QFORGE_VERSION}}},
        {"sources", std::move(sources)},
        {"recipe", std::move(recipe)},
    };
}

QType target_qtype(const TensorSpec& spec, QType source, const std::optional<QType>& requested) {
    if (!requested) return source;
    if (spec.shape.size() < 2) return QType::f32;
    return *requested;
}

json resolve_tokenizer(const std::string& given, const std::optional<std::string>& found,
                       const std::string& input, ConvertReport& report) {
    const std::string path = given.empty() ? found.value_or("") : given;
    if (path.empty()) {
        report.warnings.push_back("no tokenizer found beside " + input +
                                  "; the .qf will have none (pass --tokenizer FILE)");
        return nullptr;
    }
    report.tokenizer = path;
    return load_tokenizer_source(path);
}

}  // namespace qforge
