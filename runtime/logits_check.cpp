#include "runtime/logits_check.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"

namespace qforge {

bool all_finite(std::span<const float> logits) {
    // An all-ones exponent is NaN or Inf. An integer OR over the row vectorizes (a float test
    // with an early exit does not).
    constexpr uint32_t kExponent = 0x7F800000u;
    uint32_t any = 0;
    for (float v : logits) {
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        any |= static_cast<uint32_t>((bits & kExponent) == kExponent);
    }
    return any == 0;
}

void throw_non_finite_logits(std::span<const float> logits, const std::string& model_file,
                             const std::string& where) {
    size_t i = 0;
    while (i + 1 < logits.size() && std::isfinite(logits[i])) ++i;
    throw Error(model_file, {},
                "the logits at " + where + " are not finite (token id " + std::to_string(i) +
                    " is " + (std::isnan(logits[i]) ? "nan" : "inf") +
                    "): the weights hold NaN or Inf, or the activations overflow (qforge verify "
                    "scans the weights)");
}

}  // namespace qforge
