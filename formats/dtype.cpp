#include "formats/dtype.hpp"

namespace qforge {

std::string shape_to_string(std::span<const uint64_t> shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

}  // namespace qforge
