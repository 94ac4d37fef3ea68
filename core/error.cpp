#include "core/error.hpp"

#include <cstring>

namespace qforge {

namespace {

std::string compose(const std::string& file, const std::string& tensor, const std::string& detail) {
    std::string s;
    if (!file.empty()) s += file + ": ";
    if (!tensor.empty()) s += "tensor '" + tensor + "': ";
    s += detail;
    // One line: embedded newlines (e.g. from a JSON parser) would break the one-line contract.
    for (char& c : s)
        if (c == '\n' || c == '\r') c = ' ';
    return s;
}

}  // namespace

Error::Error(std::string file, std::string tensor, std::string detail)
    : std::runtime_error(compose(file, tensor, detail)),
      file_(std::move(file)),
      tensor_(std::move(tensor)),
      detail_(std::move(detail)) {}

std::string errno_text(int err) {
    char buf[256];
    // GNU strerror_r returns a pointer that may or may not be buf.
    const char* msg = strerror_r(err, buf, sizeof buf);
    return msg ? std::string(msg) : std::string("errno ") + std::to_string(err);
}

}  // namespace qforge
