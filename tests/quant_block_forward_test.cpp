// The calibration pass's layer-by-layer forward (quant/block_forward.hpp) against the CPU
// backend's full forward pass on stories260K (GQA, tied head): the same logits for several
// independent sequences, each starting at position 0.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "core/error.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "quant/block_forward.hpp"
#include "runtime/backend.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

namespace quant_block_forward_test {

using namespace qforge;

namespace {

// Requires each of the `sequences` runs of seq_len tokens' logits (from `logits`, all sequences
// back to back) within relative L2 `bound` of `backend`'s forward of that sequence from position 0.
void require_near_backend(Backend& backend, const ModelConfig& c,
                          const std::vector<int32_t>& tokens, uint64_t sequences, uint64_t seq_len,
                          const std::vector<float>& logits, double bound) {
    for (uint64_t s = 0; s < sequences; ++s) {
        auto cache = backend.new_cache(seq_len);
        std::vector<float> ref(seq_len * c.vocab_size);
        backend.forward({tokens.data() + s * seq_len, seq_len}, *cache, 0, ref);
        double diff = 0.0, norm = 0.0;
        for (size_t i = 0; i < ref.size(); ++i) {
            const double d = logits[s * seq_len * c.vocab_size + i] - ref[i];
            diff += d * d;
            norm += double(ref[i]) * ref[i];
        }
        INFO("sequence " << s << ": relative L2 " << std::sqrt(diff / norm));
        REQUIRE(std::sqrt(diff / norm) <= bound);
    }
}

}  // namespace

TEST_CASE("block forward, layer by layer, equals the CPU backend on stories260K",
          "[quant][calib][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("block-forward");
    Model model(test::convert_stories(data, "hf", dir).string());
    const ModelConfig& c = model.config();
    const uint64_t sequences = 3, seq_len = 40;
    std::mt19937 rng(7);
    std::vector<int32_t> tokens(sequences * seq_len);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);

    ThreadPool pool(2);
    BlockForward f(c, sequences, seq_len, pool);
    std::vector<float> x = embed_tokens(model, tokens);
    for (uint64_t l = 0; l < c.num_layers; ++l) run_layer(f, model, l, x);
    std::vector<float> h(x.size()), logits(tokens.size() * c.vocab_size);
    const uint64_t hidden = c.hidden_size;
    f.view = layer_view(model, 0);  // its final norm and output head
    f.norm(0, Norm::final, {x.data(), hidden}, {h.data(), hidden}, tokens.size());
    const Product head[] = {{Weight::lm_head, {logits.data(), c.vocab_size}}};
    f.products(0, {h.data(), hidden}, head, tokens.size());

    // Both are float32 with different summation orders (sgemm vs fixed-order dot products):
    // a few float32 roundings per activation, ~1e-6 relative; 1e-5 catches any wrong
    // position, mask or head mapping (those move logits by > 1e-2).
    auto cpu = make_cpu_backend(model, pool);
    require_near_backend(*cpu, c, tokens, sequences, seq_len, logits, 1e-5);
}

// bf16 products (CalibProducts::bf16) on the model stored as bf16. Each product is
// bf16_matmul on the same bf16 weights with its input rounded to bf16, bit for bit (for any
// thread count and across token panels); the whole forward then stays near the CPU backend's
// bf16-activation mode, which rounds the same products' inputs. Not bit-near: a 1e-6 difference
// elsewhere (attention's summation order) moves an activation across a bf16 rounding boundary
// now and then, a 2^-8 step, so the bound is the runtime's bf16 test's (3e-2: each rounding
// moves an activation by at most 2^-8; a wrong pair order or a dropped pair moves logits by tens
// of percent).
TEST_CASE("block forward with bf16 products: bf16_matmul's bits, near the CPU backend's bf16 mode",
          "[quant][calib][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    if (!bf16_dot_available()) {
        WARN("no AVX-512 BF16 at this process's level: bf16 products are refused, not run");
        ThreadPool pool(1);
        REQUIRE_THROWS_AS(BlockForward(ModelConfig{}, 1, 2, pool, CalibProducts::bf16), Error);
        return;
    }
    test::ScratchDir dir("block-forward-bf16");
    ConvertOptions o;
    o.input = (data / "stories260K" / "hf").string();
    o.output = (dir / "bf16.qf").string();
    o.tokenizer = (data / "stories260K" / "tok512.bin").string();
    o.dtype = QType::bf16;
    convert_checkpoint(o);
    Model model(o.output);
    const ModelConfig& c = model.config();

    // Every linear of a block, on 600 random tokens (two panels of kPanelTokens).
    const uint64_t n = 600;
    for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        BlockForward f(c, 1, n, pool, CalibProducts::bf16);
        for (int wi = 0; wi <= kBlockLinears; ++wi) {
            const Matrix& w = model.weight(1, Weight(wi));
            const auto x = test::kernel_activations(n, w.cols, 5 + static_cast<uint32_t>(wi));
            std::vector<float> y(n * w.rows), ref(n * w.rows);
            f.linear(w, x.data(), n, y.data());
            Bf16PackedRows p(w.rows, w.cols);
            p.pack(w.data, w.row_bytes(), 0, p.tiles());
            Bf16Tokens t;
            t.prepare(x.data(), n, w.cols);
            bf16_matmul(p, 0, w.rows, t, 0, n, ref.data(), w.rows);
            INFO("threads " << threads << " weight " << wi);
            REQUIRE(std::memcmp(y.data(), ref.data(), 4 * y.size()) == 0);
        }
    }

    const uint64_t sequences = 3, seq_len = 40;
    std::mt19937 rng(8);
    std::vector<int32_t> tokens(sequences * seq_len);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
    std::vector<float> first;
    for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        BlockForward f(c, sequences, seq_len, pool, CalibProducts::bf16);
        std::vector<float> x = embed_tokens(model, tokens);
        for (uint64_t l = 0; l < c.num_layers; ++l) run_layer(f, model, l, x);
        std::vector<float> h(x.size()), logits(tokens.size() * c.vocab_size);
        f.view = layer_view(model, 0);
        f.norm(0, Norm::final, {x.data(), c.hidden_size}, {h.data(), c.hidden_size}, tokens.size());
        const Product head[] = {{Weight::lm_head, {logits.data(), c.vocab_size}}};
        f.products(0, {h.data(), c.hidden_size}, head, tokens.size());
        if (first.empty()) {
            first = logits;
        } else {
            INFO("threads " << threads);
            REQUIRE(std::memcmp(first.data(), logits.data(), 4 * logits.size()) == 0);
        }
    }
    ThreadPool pool(2);
    auto cpu = make_cpu_backend(model, pool, {.bf16_activations = true});
    require_near_backend(*cpu, c, tokens, sequences, seq_len, first, 3e-2);
}

// Attention with bf16 products (BlockForward::attention_bf16) against a float64 reference on
// the same rotated q and k (read back from an f32-products run, which rotates them in place):
// GQA (3 query heads a KV head), head_dim 40 (pairs not a whole AMX step), 150 positions (a
// partial last block), causal and within a sliding window of 50 (blocks whose keys start past 0).
// The bound, per output (query, head, channel c), with u = 2^-8 (bf16 keeps 8 significant bits)
// and f32 chains of n products within (n + 5) 2^-24 of their absolute sum (kernels/cpu/
// bf16_gemm.hpp: vdpbf16ps and tdpbf16ps round after each product). Each logit s_j = fl(scale
// q . k_j) moves by at most d_j = scale (2u + u^2 + (hd + 9) 2^-24) sum_i |q_i k_ji|: q and k
// rounded, the chain (hd + 5), the scale's multiply and its float value (2), the cross term
// 2u (hd + 5) 2^-24 (2 more). So each softmax weight moves by a factor within exp(+-2D), D =
// max_j d_j, and sum_j |p'_j - p_j| <= expm1(2D). The f32 softmax then computes each weight
// within a relative sigma = 2 theta + (ceil(len / 8) + 5) 2^-24 of the softmax of its logits
// (kernels/cpu/activation.hpp): theta = 2^-22 (exp within 2 ulp) + 2^-24 L (the rounding of
// s_j - max, L the logits' spread), on the numerator and in the sum; the sum's eight chains
// and three-level tree; the reciprocal and the multiply. P and v rounded to bf16 (u each), the
// P V chain (len + 5) 2^-24 of sum_j |p_j v_jc|. With M = max_j |v_jc| over the keys the query
// sees: |O - ref| <= M ((((1 + sigma)(1 + u) e^(2D) - 1)(1 + u) + u) + (len + 5) 2^-24 (1 + u)^2
// (1 + sigma)). Inputs are scaled so D stays small (logits near 0.1): a key outside the mask, a
// wrong head or a dropped pair moves an output by far more. Bits identical
// for 1 and 3 threads.
TEST_CASE("block forward attention with bf16 products: within bf16's bound of float64",
          "[quant][calib]") {
    if (!bf16_dot_available()) {
        WARN("no AVX-512 BF16 at this process's level: bf16 products are refused, not run");
        return;
    }
    ModelConfig c;
    c.vocab_size = 16;
    c.hidden_size = 240;
    c.intermediate_size = 64;
    c.num_layers = 1;
    c.num_heads = 6;
    c.num_kv_heads = 2;
    c.head_dim = 40;
    c.max_position_embeddings = 256;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    const uint64_t sequences = 2, seq_len = 150, n = sequences * seq_len;
    const uint64_t hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim(), group = 3;
    for (const uint64_t window : {uint64_t{0}, uint64_t{50}}) {
        if (window) c.sliding_window = window;
        std::vector<float> q0 = test::kernel_activations(n, qd, 11);
        std::vector<float> k0 = test::kernel_activations(n, kvd, 12);
        const std::vector<float> v = test::kernel_activations(n, kvd, 13);
        for (float& x : q0) x *= 0.25f;
        for (float& x : k0) x *= 0.25f;
        // The rotated q and k: an f32-products run rotates them in place.
        std::vector<float> q = q0, k = k0;
        {
            ThreadPool pool(1);
            BlockForward f(c, sequences, seq_len, pool, CalibProducts::f32);
            std::vector<float> vv = v, o(n * qd);
            f.attention(0, {q.data(), qd}, {k.data(), kvd}, {vv.data(), kvd}, {o.data(), qd}, n);
        }
        std::vector<float> first;
        for (int threads : {1, 3}) {
            ThreadPool pool(threads);
            BlockForward f(c, sequences, seq_len, pool, CalibProducts::bf16);
            std::vector<float> qq = q0, kk = k0, vv = v, o(n * qd);
            f.attention(0, {qq.data(), qd}, {kk.data(), kvd}, {vv.data(), kvd}, {o.data(), qd}, n);
            REQUIRE(std::memcmp(qq.data(), q.data(), 4 * q.size()) == 0);  // the same rotation
            REQUIRE(std::memcmp(kk.data(), k.data(), 4 * k.size()) == 0);
            if (first.empty()) {
                first = o;
            } else {
                INFO("threads " << threads);
                REQUIRE(std::memcmp(first.data(), o.data(), 4 * o.size()) == 0);
            }
        }
        const double u = 0x1p-8, scale = 1.0 / std::sqrt(static_cast<double>(hd));
        double worst = 0.0;
        for (uint64_t s = 0; s < sequences; ++s)
            for (uint64_t pos = 0; pos < seq_len; ++pos)
                for (uint64_t h = 0; h < c.num_heads; ++h) {
                    const uint64_t t = s * seq_len + pos, kvh = h / group;
                    const uint64_t lo = window && pos + 1 > window ? pos + 1 - window : 0;
                    std::vector<double> p(pos + 1 - lo);
                    double top = -1e300, d = 0.0;
                    for (uint64_t j = lo; j <= pos; ++j) {
                        double dot = 0.0, mag = 0.0;
                        for (uint64_t i = 0; i < hd; ++i) {
                            const double a = q[t * qd + h * hd + i],
                                         b = k[(s * seq_len + j) * kvd + kvh * hd + i];
                            dot += a * b;
                            mag += std::fabs(a * b);
                        }
                        p[j - lo] = scale * dot;
                        top = std::max(top, p[j - lo]);
                        d = std::max(
                            d,
                            scale * (2 * u + u * u + static_cast<double>(hd + 9) * 0x1p-24) * mag);
                    }
                    const double spread = top - *std::min_element(p.begin(), p.end()) + 2 * d;
                    double sum = 0.0;
                    for (double& x : p) sum += x = std::exp(x - top);
                    const double len = static_cast<double>(pos + 1 - lo);
                    const double theta = 0x1p-22 + 0x1p-24 * spread + 0x1p-40;
                    const double sigma = 2 * theta + (std::ceil(len / 8) + 5) * 0x1p-24;
                    for (uint64_t ch = 0; ch < hd; ++ch) {
                        double ref = 0.0, m = 0.0;
                        for (uint64_t j = lo; j <= pos; ++j) {
                            const double vj = v[(s * seq_len + j) * kvd + kvh * hd + ch];
                            ref += p[j - lo] / sum * vj;
                            m = std::max(m, std::fabs(vj));
                        }
                        const double bound =
                            m * (((1 + sigma) * (1 + u) * std::exp(2 * d) - 1) * (1 + u) + u +
                                 (len + 5) * 0x1p-24 * (1 + u) * (1 + u) * (1 + sigma));
                        const double err = std::fabs(first[t * qd + h * hd + ch] - ref);
                        worst = std::max(worst, err / bound);
                        INFO("window " << window << " sequence " << s << " position " << pos
                                       << " head " << h << " channel " << ch);
                        REQUIRE(err <= bound);
                    }
                }
        INFO("window " << window << ": largest error / bound " << worst);
        REQUIRE(worst > 0.0);  // bf16 rounding is there: the bf16 path ran
    }
}

}  // namespace quant_block_forward_test
