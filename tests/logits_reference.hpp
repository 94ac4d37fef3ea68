// Logits written by a reference forward (transformers running the same GGUF, the scripts
// make_*_logits_fixture.py) for a real model's converted .qf: the input ids, the checked
// positions, the sampled vocabulary ids at each of them, their logits and each position's argmax.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "formats/gguf.hpp"

namespace qforge::test {

struct LogitsReference {
    std::vector<int32_t> ids, positions, samples, argmax;
    std::vector<float> want;  // positions x samples

    // The arrays under `prefix` (e.g. "qforge." or "qforge.chat.") and the tensor `logits`.
    LogitsReference(const GgufFile& ref, const std::string& prefix, const std::string& logits) {
        auto ints = [&](const char* key) {
            const auto x = ref.get_int_array(prefix + key);
            return std::vector<int32_t>(x.begin(), x.end());
        };
        ids = ints("input_ids");
        positions = ints("positions");
        samples = ints("sample_ids");
        argmax = ints("argmax");
        const GgufTensorInfo& info = *ref.find_tensor(logits);
        REQUIRE(info.elements == positions.size() * samples.size());
        want.resize(info.elements);
        std::memcpy(want.data(), ref.tensor_data(info).data(), want.size() * sizeof(float));
    }

    // Checked position p's relative L2 error over the sampled ids, for qforge's logits row of
    // `vocab` floats; its argmax must be the reference's.
    double error_at(size_t p, const float* row, uint64_t vocab) const {
        double diff = 0.0, norm = 0.0;
        for (size_t s = 0; s < samples.size(); ++s) {
            const double w = want[p * samples.size() + s];
            const double d = row[samples[s]] - w;
            diff += d * d;
            norm += w * w;
        }
        CHECK(std::max_element(row, row + vocab) - row == argmax[p]);
        return std::sqrt(diff / norm);
    }
};

}  // namespace qforge::test
