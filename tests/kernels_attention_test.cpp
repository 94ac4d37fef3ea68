// kernels/cpu/attention: head_scores and head_mix at every instruction-set level this CPU has,
// against float64 sums, on odd shapes (hd with and without a tail past its 8-blocks, groups that
// are not a multiple of the 4-head tiles, runs of 1 to 23 positions, strides wider than hd);
// outputs poisoned first (scores) or filled with values the sums must keep (mix). Then the
// property the runtime relies on: splitting the positions into runs (as the KV cache's blocks
// do) gives the same bits, and avx512 gives avx2's bits; and the avx2 and avx512 scores against
// attention.hpp's sequence of operations written out with std::fma, bit for bit.
//
// Tolerances (u = 2^-24). A float sum whose terms pass through at most n roundings is within
// n u sum |terms| of the exact sum (the factor 1.01 covers second-order terms):
//   scores: per level at most hd / 8 chain steps (or hd / 8 lane adds), 3 tree levels, hd mod 8
//           tail adds, each product rounded once, then the product with scale: n = hd + 5 bounds
//           every path; terms |q_i k_i| |scale|.
//   mix:    each output element adds its n positions' products to its start value in order,
//           one (avx2: fused) or two (scalar) roundings per step: n = 2 n_pos + 1; terms |start|
//           and |p_j v_j|.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/half.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/isa.hpp"

namespace kernels_attention_test {

using namespace qforge;

namespace {

constexpr double kU = 1.0 / (1 << 24);

std::vector<float> random_floats(uint64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

struct Shape {
    uint64_t hd, group, n, stride;
};

std::vector<Shape> shapes() {
    std::vector<Shape> s;
    for (uint64_t hd : {4u, 8u, 12u, 64u, 72u, 128u, 136u})
        for (uint64_t group : {1u, 3u, 5u, 8u})
            for (uint64_t n : {1u, 7u, 16u, 23u}) s.push_back({hd, group, n, hd * 2 + 3});
    return s;
}

// The avx2 and avx512 levels' score (attention.hpp): 8 lanes, lane l the fused chain over i = l,
// l + 8, ... below hd's last whole 8-block, the tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3
// + l7)), then the hd mod 8 tail's products added one at a time, then times scale. std::fma for
// the chains: this file is compiled without FMA instructions, so nothing else fuses.
float avx2_score(const float* q, const float* k, uint64_t hd, float scale) {
    const uint64_t whole = hd / 8 * 8;
    float lane[8] = {};
    for (uint64_t i = 0; i < whole; ++i) lane[i % 8] = std::fma(q[i], k[i], lane[i % 8]);
    float s =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    for (uint64_t i = whole; i < hd; ++i) {
        const float p = q[i] * k[i];
        s += p;
    }
    return s * scale;
}

}  // namespace

TEST_CASE(
    "attention: head_scores at every level agrees with a float64 dot within derived bounds, and "
    "avx2 and above with their documented operations bit for bit",
    "[kernels][attention]") {
    uint32_t seed = 1;
    for (const Shape& sh : shapes()) {
        const auto q = random_floats(sh.group * sh.hd, seed++);
        const auto keys = random_floats(sh.n * sh.stride, seed++);
        const float scale = 0.125f;
        const uint64_t ld = sh.n + 2;
        for (Isa isa : cpu_isa_levels()) {
            std::vector<float> scores(sh.group * ld, std::nanf(""));
            head_scores(isa, q.data(), sh.group, sh.hd, keys.data(), sh.stride, sh.n, scale,
                        scores.data(), ld);
            for (uint64_t g = 0; g < sh.group; ++g) {
                for (uint64_t j = 0; j < sh.n; ++j) {
                    double exact = 0, mag = 0;
                    for (uint64_t i = 0; i < sh.hd; ++i) {
                        const double t = static_cast<double>(q[g * sh.hd + i]) *
                                         static_cast<double>(keys[j * sh.stride + i]);
                        exact += t;
                        mag += std::fabs(t);
                    }
                    exact *= scale;
                    const double bound = 1.01 * static_cast<double>(sh.hd + 5) * kU * mag * scale;
                    INFO("isa " << isa_name(isa) << " hd " << sh.hd << " group " << sh.group
                                << " n " << sh.n << " g " << g << " j " << j);
                    REQUIRE(std::fabs(scores[g * ld + j] - exact) <= bound);
                    if (isa >= Isa::avx2) {  // and exactly the documented operations
                        const float e = avx2_score(q.data() + g * sh.hd,
                                                   keys.data() + j * sh.stride, sh.hd, scale);
                        REQUIRE(std::memcmp(&scores[g * ld + j], &e, 4) == 0);
                    }
                }
                for (uint64_t j = sh.n; j < ld; ++j) REQUIRE(std::isnan(scores[g * ld + j]));
            }
        }
    }
}

TEST_CASE("attention: head_mix at every level agrees with float64 sums within derived bounds",
          "[kernels][attention]") {
    uint32_t seed = 100;
    for (const Shape& sh : shapes()) {
        const uint64_t ld = sh.n + 1;
        const auto p = random_floats(sh.group * ld, seed++);
        const auto values = random_floats(sh.n * sh.stride, seed++);
        const auto start = random_floats(sh.group * sh.hd, seed++);
        for (Isa isa : cpu_isa_levels()) {
            std::vector<float> out = start;
            head_mix(isa, p.data(), ld, sh.group, sh.hd, values.data(), sh.stride, sh.n,
                     out.data());
            for (uint64_t g = 0; g < sh.group; ++g)
                for (uint64_t i = 0; i < sh.hd; ++i) {
                    double exact = start[g * sh.hd + i], mag = std::fabs(exact);
                    for (uint64_t j = 0; j < sh.n; ++j) {
                        const double t = static_cast<double>(p[g * ld + j]) *
                                         static_cast<double>(values[j * sh.stride + i]);
                        exact += t;
                        mag += std::fabs(t);
                    }
                    const double bound = 1.01 * static_cast<double>(2 * sh.n + 1) * kU * mag;
                    INFO("isa " << isa_name(isa) << " hd " << sh.hd << " group " << sh.group
                                << " n " << sh.n << " g " << g << " i " << i);
                    REQUIRE(std::fabs(out[g * sh.hd + i] - exact) <= bound);
                }
        }
    }
}

TEST_CASE("attention: runs of positions give the same bits as one run, and avx512 gives avx2 bits",
          "[kernels][attention]") {
    uint32_t seed = 200;
    for (const Shape& sh : shapes()) {
        const uint64_t ld = sh.n;
        const auto q = random_floats(sh.group * sh.hd, seed++);
        const auto kv = random_floats(sh.n * sh.stride, seed++);
        const auto start = random_floats(sh.group * sh.hd, seed++);
        std::vector<float> avx2_scores, avx2_out;
        for (Isa isa : cpu_isa_levels()) {
            std::vector<float> whole(sh.group * ld), split(sh.group * ld);
            head_scores(isa, q.data(), sh.group, sh.hd, kv.data(), sh.stride, sh.n, 0.5f,
                        whole.data(), ld);
            std::vector<float> out_whole = start, out_split = start;
            head_mix(isa, whole.data(), ld, sh.group, sh.hd, kv.data(), sh.stride, sh.n,
                     out_whole.data());
            // Runs of 5, 1, 5, 1, ... positions, each prefetching (Ahead) the rest of the rows
            // (more lines than steps) or the next run's (fewer), as the runtime does: the
            // prefetches change no bit.
            const auto* bytes = reinterpret_cast<const uint8_t*>(kv.data());
            for (uint64_t j = 0, run; j < sh.n; j += run) {
                run = std::min<uint64_t>(sh.n - j, j % 6 == 0 ? 5 : 1);
                const uint64_t next = 4 * (j + run) * sh.stride;
                const Ahead rest{bytes + next, 4 * kv.size() - next};
                const Ahead one{bytes + next, std::min<uint64_t>(4 * sh.stride, rest.bytes)};
                head_scores(isa, q.data(), sh.group, sh.hd, kv.data() + j * sh.stride, sh.stride,
                            run, 0.5f, split.data() + j, ld, rest);
                head_mix(isa, whole.data() + j, ld, sh.group, sh.hd, kv.data() + j * sh.stride,
                         sh.stride, run, out_split.data(), one);
            }
            INFO("isa " << isa_name(isa) << " hd " << sh.hd << " group " << sh.group << " n "
                        << sh.n);
            REQUIRE(std::memcmp(whole.data(), split.data(), 4 * whole.size()) == 0);
            REQUIRE(std::memcmp(out_whole.data(), out_split.data(), 4 * out_whole.size()) == 0);
            if (isa == Isa::avx2) {
                avx2_scores = whole;
                avx2_out = out_whole;
            } else if (isa > Isa::avx2) {
                REQUIRE(std::memcmp(whole.data(), avx2_scores.data(), 4 * whole.size()) == 0);
                REQUIRE(std::memcmp(out_whole.data(), avx2_out.data(), 4 * out_whole.size()) == 0);
            }
        }
    }
}

TEST_CASE("attention: f16 rows give the bits of the same rows widened to float, at every level",
          "[kernels][attention]") {
    // An f16 KV cache's keys and values go to the kernels as halves (widened as they are read);
    // widening is exact, so the products must equal the float kernels' on the widened rows.
    uint32_t seed = 400;
    for (const Shape& sh : shapes()) {
        const uint64_t ld = sh.n;
        const auto q = random_floats(sh.group * sh.hd, seed++);
        const auto src = random_floats(sh.n * sh.stride, seed++);
        const auto start = random_floats(sh.group * sh.hd, seed++);
        std::vector<uint16_t> halves(src.size());
        std::vector<float> widened(src.size());
        for (size_t i = 0; i < src.size(); ++i) {
            halves[i] = f32_to_f16(src[i]);
            widened[i] = f16_to_f32(halves[i]);
        }
        for (Isa isa : cpu_isa_levels()) {
            std::vector<float> from_floats(sh.group * ld), from_halves(sh.group * ld, -1.0f);
            head_scores(isa, q.data(), sh.group, sh.hd, widened.data(), sh.stride, sh.n, 0.5f,
                        from_floats.data(), ld);
            head_scores(isa, q.data(), sh.group, sh.hd, halves.data(), sh.stride, sh.n, 0.5f,
                        from_halves.data(), ld);
            std::vector<float> out_floats = start, out_halves = start;
            head_mix(isa, from_floats.data(), ld, sh.group, sh.hd, widened.data(), sh.stride, sh.n,
                     out_floats.data());
            head_mix(isa, from_floats.data(), ld, sh.group, sh.hd, halves.data(), sh.stride, sh.n,
                     out_halves.data());
            INFO("isa " << isa_name(isa) << " hd " << sh.hd << " group " << sh.group << " n "
                        << sh.n);
            REQUIRE(std::memcmp(from_floats.data(), from_halves.data(), 4 * from_floats.size()) ==
                    0);
            REQUIRE(std::memcmp(out_floats.data(), out_halves.data(), 4 * out_floats.size()) == 0);
        }
    }
}

}  // namespace kernels_attention_test
