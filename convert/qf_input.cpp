#include "convert/qf_input.hpp"

#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "core/alloc.hpp"
#include "sources/detect.hpp"
#include "sources/model_source.hpp"

namespace qforge {

namespace fs = std::filesystem;

namespace {

// A name of this process alone ("qforge-<pid>-<n>-<input name>.qf"): two commands converting
// the same input at once must not share a file.
std::string temporary_qf_path(const std::string& input) {
    static std::atomic<uint64_t> counter{0};
    const std::string base = fs::path(input).filename().string();
    return (fs::temp_directory_path() /
            ("qforge-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
             (base.empty() ? std::string("model") : base) + ".qf"))
        .string();
}

}  // namespace

QfInput::QfInput(const std::string& input, const std::string& tokenizer) : path_(input) {
    if (detect_model_file(input).kind == ModelFileKind::qf && tokenizer.empty()) return;
    ConvertOptions options;
    options.input = input;
    options.output = temporary_qf_path(input);
    options.tokenizer = tokenizer;
    report_ = naming_file_on_bad_alloc(input, [&] {
        const auto src = open_model_source(input, SourceOptions{.tokenizer = tokenizer});
        return convert_source(*src, options);
    });
    path_ = options.output;
    converted_ = true;
}

QfInput::~QfInput() {
    if (!converted_) return;
    std::error_code ec;
    fs::remove(path_, ec);  // a mapping made from it stays valid
}

}  // namespace qforge
