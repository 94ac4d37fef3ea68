// Errors are values with context: which file, which tensor, what was expected and what was
// found. Every layer throws qforge::Error; the CLI turns it into one line and an exit code.
#pragma once

#include <stdexcept>
#include <string>

namespace qforge {

class Error : public std::runtime_error {
  public:
    // `file` and `tensor` may be empty when they do not apply. The message reads
    //   "<file>: tensor '<tensor>': <detail>"
    Error(std::string file, std::string tensor, std::string detail);
    explicit Error(std::string detail) : Error({}, {}, std::move(detail)) {}

    const std::string& file() const { return file_; }
    const std::string& tensor() const { return tensor_; }
    const std::string& detail() const { return detail_; }

    // The same error with a file name attached (used when a lower layer did not know it).
    Error with_file(const std::string& file) const { return Error(file, tensor_, detail_); }

  private:
    std::string file_;
    std::string tensor_;
    std::string detail_;
};

// The text of errno for system-call failures, e.g. "No space left on device".
std::string errno_text(int err);

}  // namespace qforge
