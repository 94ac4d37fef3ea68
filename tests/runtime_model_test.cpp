// The CPU backend on small random models written here (every architecture feature: GQA, q/k/v
// biases, tied and untied heads, llama3 RoPE scaling, f32/f16/bf16 weights) against the float64
// reference forward, and its invariants: identical logits for any thread count, prefill equal to
// token-by-token decode, long batches equal to short ones. Plus the loader's refusals.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <vector>

#include "core/alloc.hpp"
#include "core/half.hpp"
#include "formats/architectures.hpp"
#include "formats/qf.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/qdot.hpp"
#include "quant/block_forward.hpp"
#include "quant/hessian.hpp"
#include "runtime/backend.hpp"
#include "runtime/backend_factory.hpp"
#include "runtime/model.hpp"
#include "runtime/reference_forward.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

namespace runtime_model_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny_config(Architecture arch) {
    ModelConfig c;
    c.arch = arch;
    c.vocab_size = 97;
    c.hidden_size = 48;
    c.intermediate_size = 70;  // not a multiple of 8: exercises the dot-product tails
    c.num_layers = 2;
    c.num_heads = 6;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.max_position_embeddings = 320;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    c.torch_dtype = "float32";
    return c;
}

// A matrix [rows, cols] of floats stored as `qtype`: float bytes, or rows through the reference
// quantizer.
std::vector<uint8_t> matrix_bytes(QType qtype, const std::vector<uint64_t>& shape,
                                  const std::vector<float>& v) {
    if (!qtype_is_quantized(qtype)) return test::float_bytes(qtype, v);
    const uint64_t row = *qtype_row_bytes(qtype, shape[1]);
    std::vector<uint8_t> out(shape[0] * row);
    for (uint64_t r = 0; r < shape[0]; ++r)
        REQUIRE(quantize_row_ref(qtype, v.data() + r * shape[1], shape[1], out.data() + r * row) ==
                QuantStatus::ok);
    return out;
}

// Random weights with the scale of a trained model (rows of norm ~1, norms near 1), matrices
// in `qtype`, vectors in f32. `shape_override` replaces one tensor's shape (broken files).
void write_model(const fs::path& path, const ModelConfig& c, QType qtype, uint32_t seed,
                 const std::string& broken_tensor = {}) {
    std::mt19937 rng(seed);
    QfWriter w(path.string());
    w.set_model(model_config_to_json(c));
    for (const auto& spec : expected_tensors(c)) {
        if (spec.name == broken_tensor) continue;
        uint64_t n = 1;
        for (uint64_t d : spec.shape) n *= d;
        std::vector<float> v(n);
        if (spec.is_matrix) {
            std::normal_distribution<float> dist(
                0.0f, 1.0f / std::sqrt(static_cast<float>(spec.shape[1])));
            for (auto& x : v) x = dist(rng);
            if (spec.name == "embed")
                for (auto& x : v) x *= 4.0f;
            w.add_tensor(spec.name, qtype, spec.shape, matrix_bytes(qtype, spec.shape, v));
        } else {
            const bool is_bias = spec.name.find("bias") != std::string::npos;
            std::normal_distribution<float> dist(is_bias ? 0.0f : 1.0f, is_bias ? 0.5f : 0.1f);
            for (auto& x : v) x = dist(rng);
            w.add_tensor(spec.name, QType::f32, spec.shape, test::float_bytes(QType::f32, v));
        }
    }
    w.finish();
}

std::vector<int32_t> some_tokens(size_t n, uint64_t vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
    t[0] = 1;
    return t;
}

std::vector<float> run(Backend& b, std::span<const int32_t> tokens, uint64_t logits_from = 0) {
    auto cache = b.new_cache(b.model().config().max_position_embeddings);
    std::vector<float> logits((tokens.size() - logits_from) * b.model().config().vocab_size);
    b.forward(tokens, *cache, logits_from, logits);
    return logits;
}

std::vector<float> run_token_by_token(Backend& b, std::span<const int32_t> tokens) {
    const uint64_t v = b.model().config().vocab_size;
    auto cache = b.new_cache(b.model().config().max_position_embeddings);
    std::vector<float> all;
    std::vector<float> one(v);
    for (int32_t t : tokens) {
        b.forward({&t, 1}, *cache, 0, one);
        all.insert(all.end(), one.begin(), one.end());
    }
    return all;
}

// Relative L2 distance of each position's logits from the float64 reference; the largest.
double worst_rel_l2(const std::vector<float>& got, const std::vector<std::vector<double>>& ref) {
    double worst = 0.0;
    for (size_t t = 0; t < ref.size(); ++t) {
        double diff = 0.0, norm = 0.0;
        for (size_t i = 0; i < ref[t].size(); ++i) {
            const double d = got[t * ref[t].size() + i] - ref[t][i];
            diff += d * d;
            norm += ref[t][i] * ref[t][i];
        }
        worst = std::max(worst, std::sqrt(diff / norm));
    }
    return worst;
}

struct Variant {
    const char* name;
    Architecture arch;
    bool tied, bias, llama3;
    QType qtype;
    uint64_t window = 0, window_from = 0;  // sliding window, in layers from window_from on
    uint64_t head_dim = 8;
};

// The windows are shorter than the 37 test tokens, so most positions see only part of the past.
constexpr Variant kVariants[] = {
    {"llama untied f32", Architecture::llama, false, false, false, QType::f32},
    {"llama untied f16 + llama3 rope", Architecture::llama, false, false, true, QType::f16},
    {"qwen2 tied bias bf16", Architecture::qwen2, true, true, false, QType::bf16},
    {"mistral untied f16", Architecture::mistral, false, false, false, QType::f16},
    {"mistral window 5", Architecture::mistral, false, false, false, QType::f32, 5, 0},
    {"qwen3 qk-norm head_dim 12, window 7 from layer 1", Architecture::qwen3, false, false, false,
     QType::f16, 7, 1, 12},
};

ModelConfig variant_config(const Variant& v) {
    ModelConfig c = tiny_config(v.arch);
    c.tie_word_embeddings = v.tied;
    c.attention_bias = v.bias;
    // 16 positions before scaling: at head_dim 8 and theta 1e4 the wavelengths 6.3, 63, 628 and
    // 6283 fall in all three llama3 bands (kept, interpolated, divided).
    if (v.llama3) c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 16};
    if (v.window) c.sliding_window = v.window;
    c.max_window_layers = v.window_from;
    c.head_dim = v.head_dim;
    return c;
}

// The calibration pass's operations (quant/block_forward.hpp) running runtime/transformer.hpp's
// forward on the model, the tokens as one sequence: logits [n][vocab].
std::vector<float> calibration_forward(const Model& model, const std::vector<int32_t>& tokens,
                                       ThreadPool& pool) {
    const ModelConfig& c = model.config();
    const uint64_t n = tokens.size(), d = c.hidden_size;
    BlasSingleThread blas;
    BlockForward f(c, 1, n, pool);
    std::vector<float> x = embed_tokens(model, tokens);
    for (uint64_t l = 0; l < c.num_layers; ++l) run_layer(f, model, l, x);
    std::vector<float> h(x.size()), logits(n * c.vocab_size);
    f.view = layer_view(model, 0);  // its final norm and output head
    f.norm(0, Norm::final, {x.data(), d}, {h.data(), d}, n);
    const Product head[] = {{Weight::lm_head, {logits.data(), c.vocab_size}}};
    f.products(0, {h.data(), d}, head, n);
    return logits;
}

}  // namespace

TEST_CASE("cpu backend matches the float64 reference on random models", "[runtime]") {
    test::ScratchDir dir("runtime-ref");
    ThreadPool pool(2);
    for (const auto& v : kVariants) {
        INFO(v.name);
        const fs::path path = dir / "m.qf";
        write_model(path, variant_config(v), v.qtype, 3);
        Model model(path.string());
        auto cpu = make_cpu_backend(model, pool);
        const auto tokens = some_tokens(37, model.config().vocab_size, 5);
        const auto ref = reference_forward(model, tokens);
        // float32 compute: each logit is a chain of dot products of <= 70 terms through 2 layers;
        // the float64 reference differs by a few float32 roundings of the activations,
        // ~1e-6 relative. 1e-5 leaves a margin of ten while catching any wrong formula (a wrong
        // RoPE band or a missing bias moves logits by > 1e-2).
        const double err = worst_rel_l2(run(*cpu, tokens), ref);
        INFO("worst relative L2 " << err);
        REQUIRE(err <= 1e-5);
        // The calibration pass's operations on the same forward: float32 too, the same bound
        // (every architecture feature: GQA, biases, tied heads, llama3 RoPE).
        const double err_calib = worst_rel_l2(calibration_forward(model, tokens, pool), ref);
        INFO("calibration forward: worst relative L2 " << err_calib);
        REQUIRE(err_calib <= 1e-5);
        fs::remove(path);
    }
}

TEST_CASE("cpu backend: identical logits for 1, 2 and 3 threads, prefill == decode", "[runtime]") {
    test::ScratchDir dir("runtime-det");
    // bias, tied; and QK-norm with a window shorter than the prompt
    const Variant& v = kVariants[GENERATE(2, 5)];
    INFO(v.name);
    // Every float row type: prefill runs the float GEMM (kernels/cpu/float_gemm.hpp), decode
    // dot_row; the variant's own type is the model continued below.
    std::vector<float> first;
    for (QType qtype : {QType::f32, QType::f16, QType::bf16}) {
        const fs::path path = dir / (std::string(qtype_traits(qtype).name) + ".qf");
        write_model(path, variant_config(v), qtype, 9);
        Model model(path.string());
        const auto tokens = some_tokens(41, model.config().vocab_size, 2);
        first.clear();
        for (int threads : {1, 2, 3}) {
            ThreadPool pool(threads);
            // split every region
            auto cpu = make_cpu_backend(model, pool, {.min_parallel_work = 0});
            const auto prefill = run(*cpu, tokens);
            const auto decode = run_token_by_token(*cpu, tokens);
            INFO(qtype_traits(qtype).name << ", threads " << threads);
            REQUIRE(prefill == decode);  // bitwise: same dot products on the same inputs
            if (first.empty()) first = prefill;
            REQUIRE(prefill == first);  // bitwise across thread counts
        }
    }
    const fs::path path = dir / "m.qf";
    write_model(path, variant_config(v), v.qtype, 9);
    Model model(path.string());
    const auto tokens = some_tokens(41, model.config().vocab_size, 2);
    // A prompt prefilled in one batch, then continued token by token.
    ThreadPool pool(2);
    auto cpu = make_cpu_backend(model, pool);
    first = run(*cpu, tokens);
    auto cache = cpu->new_cache(64);
    const uint64_t vocab = model.config().vocab_size;
    std::vector<float> last(vocab);
    cpu->forward(std::span(tokens).first(30), *cache, 29, last);
    REQUIRE(std::equal(last.begin(), last.end(), first.begin() + 29 * vocab));
    for (size_t t = 30; t < tokens.size(); ++t) {
        cpu->forward(std::span(tokens).subspan(t, 1), *cache, 0, last);
        REQUIRE(std::equal(last.begin(), last.end(),
                           first.begin() + static_cast<std::ptrdiff_t>(t * vocab)));
    }
    REQUIRE(cache->size() == tokens.size());
}

TEST_CASE(
    "cpu backend with an f16 KV cache matches the float64 reference rounding keys and "
    "values alike and is bit-identical over prefill and decode and thread counts",
    "[runtime]") {
    test::ScratchDir dir("runtime-kv16");
    for (const auto& v : kVariants) {
        INFO(v.name);
        const fs::path path = dir / "m.qf";
        write_model(path, variant_config(v), v.qtype, 3);
        Model model(path.string());
        const auto tokens = some_tokens(37, model.config().vocab_size, 5);
        ThreadPool pool(2);
        auto f32 = make_cpu_backend(model, pool);
        auto f16 = make_cpu_backend(model, pool, {.kv_type = KvType::f16});
        const auto got = run(*f16, tokens);
        // The reference rounds the same keys and values to f16 (from its float64 values through
        // float), so the logits differ by the float32 roundings of the f32-cache test above
        // (1e-5), plus the elements whose float64 and float32 values (1e-6 apart relative, after
        // dot products and norms) round to neighbouring halves: P ~ 1e-6 / 2^-11 each, so a few
        // of the 10^3 - 10^4 elements here, each moved by one f16 ulp where the rounding moves
        // every element by up to half of one. Measured: 0.1% to 12% of the rounding's whole
        // effect (the two references apart, 3e-4 to 5e-4). Half of it bounds that with a margin
        // of four and still fails a backend that does not round (it would sit the whole effect
        // away).
        const auto ref16 = reference_forward(model, tokens, true);
        std::vector<float> rounding;
        for (const auto& row : ref16)
            for (double x : row) rounding.push_back(static_cast<float>(x));
        const double whole = worst_rel_l2(rounding, reference_forward(model, tokens));
        const double err = worst_rel_l2(got, ref16);
        INFO("worst relative L2 against the f16-KV reference " << err << ", the rounding's "
                                                               << whole);
        REQUIRE(whole > 1e-4);
        REQUIRE(err <= 1e-5 + 0.5 * whole);
        REQUIRE(got != run(*f32, tokens));  // the cache does round
        // Bit for bit: decode equals prefill, any thread count (widening is exact and the
        // kernels then run the f32 cache's operations).
        REQUIRE(run_token_by_token(*f16, tokens) == got);
        for (int threads : {1, 3}) {
            ThreadPool other(threads);
            auto b =
                make_cpu_backend(model, other, {.min_parallel_work = 0, .kv_type = KvType::f16});
            REQUIRE(run(*b, tokens) == got);
        }
        fs::remove(path);
    }
}

TEST_CASE("cpu backend: float matrices copied into huge-page memory give the in-place logits",
          "[runtime]") {
    test::ScratchDir dir("runtime-float-copy");
    for (QType qtype : {QType::f32, QType::f16, QType::bf16}) {
        INFO(qtype_traits(qtype).name);
        // A vocabulary large enough that the embedding and the LM head (untied; and tied) pass
        // the 2 MiB from which the backend copies a float matrix (kHugePageBytes), by one row.
        for (bool tied : {false, true}) {
            Variant v = kVariants[0];
            v.tied = tied;
            ModelConfig c = variant_config(v);
            c.vocab_size = kHugePageBytes / (c.hidden_size * qtype_traits(qtype).bits / 8) + 1;
            const fs::path path = dir / "m.qf";
            write_model(path, c, qtype, 13);
            Model model(path.string());
            const auto tokens = some_tokens(29, c.vocab_size, 6);
            ThreadPool pool(2);
            auto copied = make_cpu_backend(model, pool, {.min_parallel_work = 0});
            auto in_place =
                make_cpu_backend(model, pool, {.min_parallel_work = 0, .repack = false});
            const auto want = run(*in_place, tokens);
            REQUIRE(run(*copied, tokens) == want);
            REQUIRE(run_token_by_token(*copied, tokens) == want);
            fs::remove(path);
        }
    }
}

TEST_CASE("cpu backend: a batch longer than one internal step equals shorter batches",
          "[runtime]") {
    test::ScratchDir dir("runtime-long");
    const fs::path path = dir / "m.qf";
    write_model(path, variant_config(kVariants[1]), QType::f16, 4);
    Model model(path.string());
    ThreadPool pool(2);
    auto cpu = make_cpu_backend(model, pool);
    const auto tokens = some_tokens(300, model.config().vocab_size, 8);  // > kMaxBatch (256)
    const uint64_t vocab = model.config().vocab_size;
    const auto whole = run(*cpu, tokens, 250);  // logits rows span the step boundary
    auto cache = cpu->new_cache(300);
    std::vector<float> part(100 * vocab);
    cpu->forward(std::span(tokens).first(200), *cache, 100, part);
    std::vector<float> rest(100 * vocab);
    cpu->forward(std::span(tokens).subspan(200), *cache, 0, rest);
    REQUIRE(std::equal(whole.begin(), whole.end(),
                       rest.begin() + 50 * static_cast<std::ptrdiff_t>(vocab)));
}

TEST_CASE("cpu backend and model loader refuse bad input with a clear error", "[runtime]") {
    test::ScratchDir dir("runtime-bad");
    const ModelConfig c = variant_config(kVariants[0]);
    const fs::path good = dir / "good.qf";
    write_model(good, c, QType::f32, 1);
    Model model(good.string());
    ThreadPool pool(1);
    auto cpu = make_cpu_backend(model, pool);
    const uint64_t vocab = c.vocab_size;
    std::vector<float> logits(vocab);

    auto cache = cpu->new_cache(4);
    const int32_t bad_id[] = {97};
    REQUIRE_THROWS_WITH(cpu->forward(bad_id, *cache, 0, logits),
                        Contains("token id 97 is outside the vocabulary (97)"));
    const int32_t five[] = {1, 2, 3, 4, 5};
    std::vector<float> five_logits(5 * vocab);
    REQUIRE_THROWS_WITH(cpu->forward(five, *cache, 0, five_logits),
                        Contains("exceed the context of 4"));
    REQUIRE_THROWS_WITH(cpu->forward(std::span(five).first(1), *cache, 0, five_logits),
                        Contains("logits hold"));
    REQUIRE_THROWS_WITH(cpu->new_cache(321), Contains("max_position_embeddings (320)"));
    REQUIRE(cache->size() == 0);  // nothing appended by a refused call

    const fs::path missing = dir / "missing.qf";
    write_model(missing, c, QType::f32, 1, "layers.1.mlp.up");
    REQUIRE_THROWS_WITH(Model(missing.string()), Contains("layers.1.mlp.up"));

    // A tensor with the wrong shape: the config says 70 intermediate, the file has 72.
    ModelConfig wide = c;
    wide.intermediate_size = 72;
    const fs::path wrong = dir / "wrong.qf";
    write_model(wrong, wide, QType::f32, 1);
    {
        // Same tensors, but a header claiming 70: rewrite by hand through the reader/writer.
        QfFile src(wrong.string());
        const fs::path mixed = dir / "mixed.qf";
        QfWriter w(mixed.string());
        w.set_model(model_config_to_json(c));
        std::vector<uint8_t> scratch;
        for (const auto& t : src.tensors())
            w.add_tensor(t.name, t.qtype, t.shape, src.tensor_bytes(t, scratch));
        w.finish();
        REQUIRE_THROWS_WITH(Model(mixed.string()),
                            Contains("tensor 'layers.0.mlp.gate': shape [72, 48] but the config's "
                                     "intermediate_size 70 and hidden_size 48 require [70, 48]"));
    }
}

TEST_CASE(
    "cpu backend, bf16 activations: near the reference, identical for any thread count, "
    "prefill == decode",
    "[runtime]") {
    test::ScratchDir dir("runtime-bf16");
    const Variant& v = kVariants[2];
    const fs::path path = dir / "m.qf";
    write_model(path, variant_config(v), QType::bf16, 9);
    Model model(path.string());
    ThreadPool one(1);
    if (!bf16_dot_available()) {
        WARN("no AVX-512 BF16 at this process's level: the mode is refused, not run");
        REQUIRE_THROWS_AS(make_cpu_backend(model, one, {.bf16_activations = true}), Error);
        return;
    }
    const auto tokens = some_tokens(41, model.config().vocab_size, 2);
    // Each activation rounded to bf16 moves by at most 2^-8 of itself (0.4%, about 0.1% RMS
    // for Gaussian-like values); every projection (7 per layer, 2 layers, the head) adds such an
    // error, so logits move by about sqrt(15) * 0.1% ~ 0.4%; 3% as for int8 activations (whose
    // per-element rounding is larger) allows for softmax and SwiGLU. A wrong pair order or a
    // dropped pair moves logits by tens of percent.
    const auto ref = reference_forward(model, tokens);
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        auto cpu =
            make_cpu_backend(model, pool, {.min_parallel_work = 0, .bf16_activations = true});
        const auto prefill = run(*cpu, tokens);
        INFO("threads " << threads);
        REQUIRE(worst_rel_l2(prefill, ref) <= 3e-2);
        REQUIRE(prefill == run_token_by_token(*cpu, tokens));
        if (first.empty()) first = prefill;
        REQUIRE(prefill == first);
    }
    // It is another product than the exact mode's.
    auto exact = make_cpu_backend(model, one);
    REQUIRE(run(*exact, tokens) != first);
}

TEST_CASE("cpu backend runs every quantized qtype: exact with float activations, near with int8",
          "[runtime][quant]") {
    test::ScratchDir dir("runtime-quant");
    ThreadPool pool(2);
    for (const auto& row : kQTypes) {
        if (row.is_float) continue;
        INFO(row.name);
        // Every matrix quantized, the embedding too (its rows are dequantized at lookup); widths
        // 48 and 70 end in partial code chunks and partial groups.
        Variant v = kVariants[2];
        v.qtype = row.type;
        const fs::path path = dir / "m.qf";
        write_model(path, variant_config(v), v.qtype, 3);
        Model model(path.string());
        const auto tokens = some_tokens(29, model.config().vocab_size, 5);
        // The reference dequantizes every weight exactly (formats/qtype.hpp), so with float
        // activations the only difference is float32 rounding, as for float models (above).
        const auto ref = reference_forward(model, tokens);
        auto exact = make_cpu_backend(model, pool, {.int8_activations = false});
        const double err_f32 = worst_rel_l2(run(*exact, tokens), ref);
        INFO("float activations: worst relative L2 " << err_f32);
        REQUIRE(err_f32 <= 1e-5);
        // The calibration operations (sgemm on the dequantized weights) are float32 too: the
        // same bound, for every qtype the pipeline may read.
        const double err_calib = worst_rel_l2(calibration_forward(model, tokens, pool), ref);
        INFO("calibration forward: worst relative L2 " << err_calib);
        REQUIRE(err_calib <= 1e-5);
        // int8 activations round each input element by at most 1/254 of its block's largest
        // magnitude (a relative RMS near 0.2% for Gaussian-like activations); every projection
        // (7 per layer, 2 layers, the head) adds such an error, so logits move by about
        // sqrt(15) * 0.2% ~ 1%. 3% allows for the softmax and SwiGLU amplifying it; a wrong
        // scale, zero or block sum moves logits by tens of percent.
        auto fast = make_cpu_backend(model, pool);
        const double err_i8 = worst_rel_l2(run(*fast, tokens), ref);
        INFO("int8 activations: worst relative L2 " << err_i8);
        REQUIRE(err_i8 <= 3e-2);
        fs::remove(path);
    }
}

TEST_CASE("cpu backend: a matrix with a column permutation gathers its input first",
          "[runtime][quant]") {
    test::ScratchDir dir("runtime-col-perm");
    ThreadPool pool(2);
    Variant v = kVariants[2];  // qwen2: fused q/k/v with biases, tied head
    v.qtype = QType::q4_g32;
    const fs::path plain = dir / "m.qf", permuted = dir / "p.qf";
    write_model(plain, variant_config(v), v.qtype, 3);
    // The same rows with a random column permutation on every linear (as act-order imports
    // store them): another model, which reference_forward evaluates by its own gather.
    {
        const QfFile f(plain.string());
        QfWriter w(permuted.string());
        w.set_model(f.model());
        w.set_tokenizer(f.header().at("tokenizer"));
        std::mt19937 rng(5);
        std::vector<uint8_t> scratch;
        for (const QfTensorInfo& t : f.tensors()) {
            std::vector<uint32_t> perm;
            if (t.name.starts_with("layers.") && qtype_is_quantized(t.qtype)) {
                perm.resize(t.shape[1]);
                std::iota(perm.begin(), perm.end(), 0u);
                std::shuffle(perm.begin(), perm.end(), rng);
            }
            w.add_tensor(t.name, t.qtype, t.shape, f.tensor_bytes(t, scratch), perm);
        }
        w.finish();
    }
    const Model model(permuted.string());
    for (Weight w : {Weight::q, Weight::gate, Weight::down})
        REQUIRE(model.weight(1, w).col_perm != nullptr);
    const auto tokens = some_tokens(29, model.config().vocab_size, 5);
    const auto ref = reference_forward(model, tokens);
    // The bounds of the unpermuted test above: float activations 1e-5, int8 3e-2.
    auto exact = make_cpu_backend(model, pool, {.int8_activations = false});
    CHECK(worst_rel_l2(run(*exact, tokens), ref) <= 1e-5);
    auto fast = make_cpu_backend(model, pool);
    CHECK(worst_rel_l2(run(*fast, tokens), ref) <= 3e-2);
    // The permutation matters: the same rows in column order give other logits.
    const Model unpermuted(plain.string());
    auto other = make_cpu_backend(unpermuted, pool, {.int8_activations = false});
    CHECK(worst_rel_l2(run(*other, tokens), ref) > 1e-2);
    // The CUDA backend does not gather: refused by name, before any device is looked for.
    CHECK_THROWS_WITH(make_backend(BackendKind::cuda, model, pool, {}),
                      Contains("layers.0.attn.q") && Contains("column permutation"));
}

namespace {

// ||a - b|| / ||b||, in float64.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        norm += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(diff / norm);
}

}  // namespace

TEST_CASE("cpu backend, quantized: identical logits for any thread count, prefill == decode",
          "[runtime][quant]") {
    test::ScratchDir dir("runtime-quant-det");
    for (QType qtype : {QType::q4_g32, QType::q8, QType::q4s_g64, QType::q4k_g32}) {
        Variant v = kVariants[0];
        v.qtype = qtype;
        const fs::path path = dir / "m.qf";
        write_model(path, variant_config(v), v.qtype, 11);
        Model model(path.string());
        const auto tokens = some_tokens(37, model.config().vocab_size, 4);
        for (Isa isa : kIsaLevels) {
            if (isa > cpu_isa()) continue;
            for (bool int8 : {true, false}) {
                INFO(qtype_traits(qtype).name << (int8 ? " int8" : " f32") << " activations, level "
                                              << isa_name(isa));
                std::vector<float> first;
                for (int threads : {1, 2, 3}) {
                    ThreadPool pool(threads);
                    auto cpu = make_cpu_backend(
                        model, pool,
                        {.min_parallel_work = 0, .int8_activations = int8, .isa = isa});
                    const auto prefill = run(*cpu, tokens);
                    REQUIRE(prefill == run_token_by_token(*cpu, tokens));
                    if (first.empty()) first = prefill;
                    REQUIRE(prefill == first);
                    // Rows repacked at load (kernels/cpu/qpack.hpp) or read in place: at avx512
                    // both give the scalar reference's bits. At avx2 the packed kernels do, so
                    // the logits equal the scalar level's to float32 rounding in the other
                    // operations (a few times 1e-7 per layer, as the transformers comparisons
                    // find; a wrong block or scale moves them by far more than 1e-5); the row
                    // kernels sum the same exact block integers' float steps in another order,
                    // which q4k's mins turn into differences of 5e-3 here (each block's scale *
                    // code and min terms nearly cancel; tests/kernels_qdot_test.cpp bounds every
                    // product by its terms' magnitude), the other types' 1e-7.
                    auto in_place = make_cpu_backend(model, pool,
                                                     {.min_parallel_work = 0,
                                                      .int8_activations = int8,
                                                      .isa = isa,
                                                      .repack = false});
                    const auto rows = run(*in_place, tokens);
                    if (isa == Isa::avx2 && int8 && qmatmul_packed_serves(isa, qtype)) {
                        auto scalar = make_cpu_backend(
                            model, pool,
                            {.min_parallel_work = 0, .int8_activations = true, .isa = Isa::scalar});
                        const double vs_scalar = rel_l2(first, run(*scalar, tokens));
                        const double vs_rows = rel_l2(rows, first);
                        INFO("rel L2: packed vs the scalar level "
                             << vs_scalar << ", in place vs packed " << vs_rows);
                        REQUIRE(vs_scalar <= 1e-5);
                        if (!qtype_has_super_blocks(qtype)) REQUIRE(vs_rows <= 1e-5);
                    } else {
                        REQUIRE(rows == first);
                    }
                }
            }
        }
        fs::remove(path);
    }
}

}  // namespace runtime_model_test
