// The backend-equivalence sweep, in the manner of llama.cpp's test-backend-ops: every backend this
// build and machine have (the CPU at every instruction-set level the CPU has, with int8 and with
// float activations for quantized weights; CUDA when a device is present) x every type of the
// qtype table x two odd shapes x steps of 1, 3 and 17 tokens after a 5-token prefix in the KV
// cache. Each operation of runtime/transformer.hpp runs alone through Backend::run_ops, on inputs
// written into the backend's own activation rows, with its outputs poisoned (NaN) first, and is
// compared with a float64 reference computed from the dequantized weights within a bound derived
// from how that backend computes (tests/backend_ops_reference.hpp has every derivation):
// embedding lookup, RMSNorm (block and final weights), the fused q/k/v products (with biases in
// one shape), the output and down products accumulated into the residual, the gated product
// (SwiGLU and GeGLU), Gemma's post-norm residual add, embedding scale and logit soft-cap, the
// logits, RoPE on q and k, and attention over the cache (GQA; positions 0 .. 21).
//
// Shapes: "odd" k = 100 ends inside a 32-block, a 64 and a 128 group and a 3-bit chunk; down's k
// = 172 inside a block; GQA 2; untied head. "wide": k = 200, a whole 3-bit chunk and a partial
// one; o's k = 120; down's k = 72; GQA 3; q/k/v biases; tied head. Row counts are odd or not
// multiples of the SIMD or tile widths (67, 61 vocab rows; 3 heads of 40).
//
// Each test prints a table per backend and qtype: the largest |error| / bound per operation (1.0
// would be a failure), so the GPU check shows how close CUDA runs to its bounds.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend_ops_reference.hpp"
#include "formats/architectures.hpp"
#include "formats/qf.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cuda/gpu_format.hpp"
#include "kernels/device_info.hpp"
#include "qf_support.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/model.hpp"
#include "runtime/rope.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

namespace backend_ops_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

struct Shape {
    const char* name;
    uint64_t vocab, hidden, inter, heads, kv_heads, head_dim;
    bool tied, bias;
};
constexpr Shape kShapes[] = {
    {"odd", 67, 100, 172, 4, 2, 16, false, false},
    {"wide", 61, 200, 72, 3, 1, 40, true, true},
};
constexpr uint64_t kStepTokens[] = {1, 3, 17};
constexpr uint64_t kPrefix = 5;  // attention runs at positions 0 .. 4 first
constexpr uint64_t kCapacity = 32;

enum Op : int {
    embed,
    norm,
    qkv,
    residual,
    gated,
    logits,
    rope,
    attention,
    post_norm,
    geglu,
    embed_scale,
    logit_softcap,
    kOps
};
constexpr const char* kOpNames[kOps] = {"embed",     "norm",   "qkv",   "residual",
                                        "gated",     "logits", "rope",  "attention",
                                        "post_norm", "geglu",  "scale", "softcap"};

// One layer of llama (qf_support's smallest config, which has the eps, theta and token ids) at
// the shape's sizes.
ModelConfig shape_config(const Shape& s) {
    ModelConfig c = tiny_llama_config(s.vocab, s.hidden);
    c.intermediate_size = s.inter;
    c.num_heads = s.heads;
    c.num_kv_heads = s.kv_heads;
    c.head_dim = s.head_dim;
    c.tie_word_embeddings = s.tied;
    c.attention_bias = s.bias;
    return c;
}

// Activations with the spread of real ones: normal, one element in 97 an outlier 20x, and each
// token's row its own scale 10^-1 .. 10.
std::vector<float> activations(uint64_t n, uint64_t width, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> exponent(-1.0f, 1.0f);
    std::vector<float> x(n * width);
    for (uint64_t t = 0; t < n; ++t) {
        const float scale = std::pow(10.0f, exponent(rng));
        for (uint64_t i = 0; i < width; ++i) x[t * width + i] = scale * normal(rng);
    }
    for (uint64_t i = 0; i < x.size(); i += 97) x[i] *= 20.0f;
    return x;
}

// The model's weights in float64, and the largest error / bound per (backend, qtype, op).
struct Fixture {
    const Model& model;
    const ModelConfig& c;
    std::map<Weight, RefMatrix> w;
    RefMatrix embed;
    std::vector<double> inv_freq;
    // The products' references of each (step size, weight): the inputs depend only on the shape
    // and the step, so every backend case reuses them (the float64 sums are the sweep's cost).
    std::map<std::pair<uint64_t, Weight>, std::vector<ProductRef>> products;
    explicit Fixture(const Model& m)
        : model(m), c(m.config()), inv_freq(rope_inv_freq(m.config())) {
        for (Weight role : {Weight::q, Weight::k, Weight::v, Weight::o, Weight::gate, Weight::up,
                            Weight::down, Weight::lm_head}) {
            const Matrix& mat = m.weight(0, role);
            w[role] = ref_matrix(mat.qtype, mat.data, mat.rows, mat.cols);
        }
        embed = ref_matrix(m.embed().qtype, m.embed().data, m.embed().rows, m.embed().cols);
    }
    double bias(Weight role, uint64_t r) const {
        const auto& b = model.bias(0, role);
        return b.empty() ? 0.0 : b[r];
    }
};

struct Tally {
    double ratio[kOps] = {};
    uint64_t checked = 0, failures = 0;
    std::string first;
    void add(Op op, double got, const RefValue& ref, const std::string& where) {
        ++checked;
        const double err = std::fabs(got - ref.value);
        if (!(err <= ref.bound)) {  // NaN (a poisoned output left unwritten) fails too
            if (failures++ == 0)
                first = where + " " + kOpNames[op] + ": got " + std::to_string(got) +
                        ", reference " + std::to_string(ref.value) + ", bound " +
                        std::to_string(ref.bound);
            ratio[op] = std::numeric_limits<double>::infinity();
            return;
        }
        if (ref.bound > 0) ratio[op] = std::max(ratio[op], err / ref.bound);
    }
};

// Rotated keys and raw values of every position so far, per KV head.
struct History {
    std::vector<std::vector<std::vector<double>>> keys, values;
};

// Writes `x` ([n][width]) into rows, or NaN when x is empty.
void put(OpsStep& s, Rows dst, const std::vector<float>& x, uint64_t n, uint64_t width) {
    std::vector<float> nan(n * width, std::numeric_limits<float>::quiet_NaN());
    s.write(dst, x.empty() ? nan.data() : x.data(), n, width);
}
std::vector<float> get(OpsStep& s, Rows src, uint64_t n, uint64_t width) {
    std::vector<float> out(n * width);
    s.read(src, out.data(), n, width);
    return out;
}

// The products of rows of `m` with x ([n][m.cols]) plus bias and prior ([n][m.rows] or empty)
// against `got`.
const std::vector<ProductRef>& product_refs(Fixture& f, Weight role, const std::vector<float>& x,
                                            const std::vector<float>& prior, uint64_t n) {
    auto [it, added] = f.products.try_emplace({n, role});
    if (added) {
        const RefMatrix& m = f.w.at(role);
        for (uint64_t t = 0; t < n; ++t)
            for (uint64_t r = 0; r < m.rows; ++r) {
                const double p = prior.empty() ? 0.0 : prior[t * m.rows + r];
                it->second.push_back(ref_product(m, r, x.data() + t * m.cols, f.bias(role, r), p));
            }
    }
    return it->second;
}

void check_products(Tally& tally, Op op, Fixture& f, Weight role, const std::vector<float>& x,
                    const std::vector<float>& prior, const std::vector<float>& got, uint64_t n,
                    const Numerics& num, const std::string& where) {
    const auto& refs = product_refs(f, role, x, prior, n);
    for (size_t i = 0; i < refs.size(); ++i) tally.add(op, got[i], refs[i].at(num), where);
}

// Gemma's operations on one step of n tokens: a post-norm's residual add (with the block's MLP
// norm weight: the operation is the same for every norm of the hidden width), the embedding scale
// and the logit soft-cap.
void check_gemma_ops(OpsStep& s, const Fixture& f, uint64_t n, std::mt19937& rng, Tally& tally,
                     const std::string& where) {
    const ModelConfig& c = f.c;
    const uint64_t d = c.hidden_size;
    const BlockActivations& a = s.rows();
    ForwardOps& ops = s.ops();
    const auto x = activations(n, d, rng), prior = activations(n, d, rng);
    put(s, a.h, x, n, d);
    put(s, a.x, prior, n, d);
    ops.norm_add(0, Norm::mlp, a.h, a.x, n);
    const auto added = get(s, a.x, n, d);
    std::vector<RefValue> ref;
    for (uint64_t t = 0; t < n; ++t) {
        ref_norm(x.data() + t * d, f.model.norm(0, Norm::mlp), c.rms_norm_eps, d, ref);
        for (uint64_t i = 0; i < d; ++i) {
            const double want = prior[t * d + i] + ref[i].value;
            tally.add(post_norm, added[t * d + i],
                      {want, ref[i].bound + 1.01 * kUnitRoundoff * std::fabs(want)}, where);
        }
    }
    const float factor = std::sqrt(static_cast<float>(d)), cap = 3.0f;
    put(s, a.h, x, n, d);
    ops.scale(a.h, n, d, factor);
    const auto scaled = get(s, a.h, n, d);
    for (uint64_t i = 0; i < n * d; ++i) {
        const double want = double{x[i]} * factor;
        tally.add(embed_scale, scaled[i], {want, 1.01 * kUnitRoundoff * std::fabs(want)}, where);
    }
    put(s, a.h, x, n, d);
    ops.softcap(a.h, n, d, cap);
    const auto capped = get(s, a.h, n, d);
    for (uint64_t i = 0; i < n * d; ++i)
        tally.add(logit_softcap, capped[i],
                  {std::tanh(double{x[i]} / cap) * cap, 1.01 * 4 * kUnitRoundoff * cap}, where);
}

// Every operation but attention on one step of n tokens (inputs from rng).
void check_block_ops(OpsStep& s, Fixture& f, std::span<const int32_t> tokens, std::mt19937& rng,
                     const Numerics& num, Tally& tally, const std::string& where) {
    const ModelConfig& c = f.c;
    const uint64_t n = tokens.size(), d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(),
                   inter = c.intermediate_size;
    const BlockActivations& a = s.rows();
    ForwardOps& ops = s.ops();

    put(s, a.x, {}, n, d);
    ops.embed(s.tokens(), n, a.x);
    const auto x_embed = get(s, a.x, n, d);
    for (uint64_t t = 0; t < n; ++t)
        for (uint64_t i = 0; i < d; ++i)
            tally.add(embed, x_embed[t * d + i],
                      {f.embed.w[static_cast<uint64_t>(tokens[t]) * d + i], 0.0}, where);

    for (Norm which : {Norm::attn, Norm::final}) {
        const auto x = activations(n, d, rng);
        put(s, a.x, x, n, d);
        put(s, a.h, {}, n, d);
        ops.norm(0, which, a.x, a.h, n);
        const auto h = get(s, a.h, n, d);
        std::vector<RefValue> ref;
        for (uint64_t t = 0; t < n; ++t) {
            ref_norm(x.data() + t * d, f.model.norm(0, which), c.rms_norm_eps, d, ref);
            for (uint64_t i = 0; i < d; ++i) tally.add(norm, h[t * d + i], ref[i], where);
        }
    }

    const auto h = activations(n, d, rng);
    put(s, a.h, h, n, d);
    put(s, a.q, {}, n, qd);
    put(s, a.k, {}, n, kvd);
    put(s, a.v, {}, n, kvd);
    const bool bias = c.attention_bias;
    const Product qkv_parts[] = {{Weight::q, a.q, false, bias},
                                 {Weight::k, a.k, false, bias},
                                 {Weight::v, a.v, false, bias}};
    ops.products(0, a.h, qkv_parts, n);
    check_products(tally, qkv, f, Weight::q, h, {}, get(s, a.q, n, qd), n, num, where);
    check_products(tally, qkv, f, Weight::k, h, {}, get(s, a.k, n, kvd), n, num, where);
    check_products(tally, qkv, f, Weight::v, h, {}, get(s, a.v, n, kvd), n, num, where);

    put(s, a.mlp, {}, n, inter);
    ops.gated_products(0, a.h, Activation::silu, a.mlp, n);
    const auto mlp = get(s, a.mlp, n, inter);
    const auto& gate_refs = product_refs(f, Weight::gate, h, {}, n);
    const auto& up_refs = product_refs(f, Weight::up, h, {}, n);
    for (size_t i = 0; i < mlp.size(); ++i)
        tally.add(gated, mlp[i], ref_gated(gate_refs[i].at(num), up_refs[i].at(num)), where);
    // GeGLU (Gemma) on the same products.
    put(s, a.mlp, {}, n, inter);
    ops.gated_products(0, a.h, Activation::gelu_tanh, a.mlp, n);
    const auto mlp_gelu = get(s, a.mlp, n, inter);
    for (size_t i = 0; i < mlp_gelu.size(); ++i)
        tally.add(geglu, mlp_gelu[i], ref_gated_gelu(gate_refs[i].at(num), up_refs[i].at(num)),
                  where);

    put(s, s.logits(), {}, n, c.vocab_size);
    const Product head[] = {{Weight::lm_head, s.logits(), false, false}};
    ops.products(0, a.h, head, n);
    check_products(tally, logits, f, Weight::lm_head, h, {}, get(s, s.logits(), n, c.vocab_size), n,
                   num, where);

    // The residual adds: x += att Wo^T and x += mlp Wdown^T.
    for (auto [role, in, width] :
         {std::tuple{Weight::o, a.att, qd}, {Weight::down, a.mlp, inter}}) {
        const auto x = activations(n, width, rng), prior = activations(n, d, rng);
        put(s, in, x, n, width);
        put(s, a.x, prior, n, d);
        const Product part[] = {{role, a.x, true, false}};
        ops.products(0, in, part, n);
        check_products(tally, residual, f, role, x, prior, get(s, a.x, n, d), n, num, where);
    }
    check_gemma_ops(s, f, n, rng, tally, where);
}

// RoPE, the cache writes and attention on one step at positions hist's size onwards.
void check_attention(OpsStep& s, const Fixture& f, uint64_t n, std::mt19937& rng,
                     const Numerics& num, History& hist, Tally& tally, const std::string& where) {
    const ModelConfig& c = f.c;
    const uint64_t hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim();
    const uint64_t group = c.num_heads / c.num_kv_heads, pos0 = hist.keys[0].size();
    const BlockActivations& a = s.rows();
    const auto q = activations(n, qd, rng), k = activations(n, kvd, rng),
               v = activations(n, kvd, rng);
    put(s, a.q, q, n, qd);
    put(s, a.k, k, n, kvd);
    put(s, a.v, v, n, kvd);
    put(s, a.att, {}, n, qd);
    s.ops().attention(0, a.q, a.k, a.v, a.att, n);
    const auto att = get(s, a.att, n, qd), q_rot = get(s, a.q, n, qd), k_rot = get(s, a.k, n, kvd);
    std::vector<double> rotated, bound;
    std::vector<RefValue> out;
    for (uint64_t t = 0; t < n; ++t) {
        const uint64_t pos = pos0 + t;
        for (uint64_t kvh = 0; kvh < c.num_kv_heads; ++kvh) {
            ref_rope(k.data() + t * kvd + kvh * hd, hd, f.inv_freq, pos, rotated, bound);
            for (uint64_t i = 0; i < hd; ++i)
                tally.add(rope, k_rot[t * kvd + kvh * hd + i], {rotated[i], bound[i]}, where);
            hist.keys[kvh].push_back(rotated);
            hist.values[kvh].emplace_back(v.begin() + static_cast<long>(t * kvd + kvh * hd),
                                          v.begin() + static_cast<long>(t * kvd + (kvh + 1) * hd));
        }
        for (uint64_t head = 0; head < c.num_heads; ++head) {
            ref_rope(q.data() + t * qd + head * hd, hd, f.inv_freq, pos, rotated, bound);
            for (uint64_t i = 0; i < hd; ++i)
                tally.add(rope, q_rot[t * qd + head * hd + i], {rotated[i], bound[i]}, where);
            ref_attention(rotated, hist.keys[head / group], hist.values[head / group], hd, num,
                          out);
            for (uint64_t i = 0; i < hd; ++i)
                tally.add(attention, att[t * qd + head * hd + i], out[i], where);
        }
    }
}

struct BackendCase {
    std::string name;
    Numerics num;
    bool quantized_only = false;  // float rows take no activation mode: one case covers them
    std::function<std::unique_ptr<Backend>(const Model&)> make;
};

// Runs every shape and step size on one backend case and qtype; returns false (with the reason
// in `skipped`) when the backend declares this qtype or shape unsupported, as CUDA does for the
// types and shapes its kernels do not run (kernels/cuda/gpu_format.hpp), at set-up or at a launch.
bool sweep(const BackendCase& bc, QType qtype, std::vector<Fixture>& fixtures, Tally& tally,
           std::string& skipped) {
    for (size_t si = 0; si < fixtures.size(); ++si) {
        Fixture& f = fixtures[si];
        try {
            std::unique_ptr<Backend> backend = bc.make(f.model);
            for (uint64_t n : kStepTokens) {
                // The same inputs for every backend: the seed names the shape and the step.
                std::mt19937 rng(static_cast<uint32_t>(1000 * si + n));
                const std::string where = bc.name + " " + std::string(qtype_traits(qtype).name) +
                                          " " + kShapes[si].name + " n=" + std::to_string(n);
                History hist;
                hist.keys.resize(f.c.num_kv_heads);
                hist.values.resize(f.c.num_kv_heads);
                auto cache = backend->new_cache(kCapacity);
                std::vector<int32_t> prefix(kPrefix, 1), tokens(n);
                backend->run_ops(prefix, *cache, [&](OpsStep& s) {
                    check_attention(s, f, kPrefix, rng, bc.num, hist, tally, where + " prefix");
                });
                for (auto& id : tokens) id = static_cast<int32_t>(rng() % f.c.vocab_size);
                backend->run_ops(tokens, *cache, [&](OpsStep& s) {
                    check_block_ops(s, f, tokens, rng, bc.num, tally, where);
                    check_attention(s, f, n, rng, bc.num, hist, tally, where);
                });
            }
        } catch (const cuda::UnsupportedOnCuda& e) {
            skipped = std::string(kShapes[si].name) + ": " + e.what();
            return false;
        }
    }
    return true;
}

// Writes the models of every shape in every qtype of the table once, then runs each case over
// them; prints the table; fails on the first failure of each (backend, qtype).
void run_sweep(const std::vector<BackendCase>& cases, const std::string& scratch_name) {
    ScratchDir dir(scratch_name);
    std::printf("%-20s %-9s", "backend", "qtype");
    for (const char* op : kOpNames) std::printf(" %9s", op);
    std::printf("   (largest |error| / bound)\n");
    for (const QTypeTraits& tr : kQTypes) {
        std::vector<std::unique_ptr<Model>> models;
        std::vector<Fixture> fixtures;
        for (size_t si = 0; si < std::size(kShapes); ++si) {
            const fs::path path = dir / (std::string(tr.name) + "_" + kShapes[si].name + ".qf");
            write_random_model(path, shape_config(kShapes[si]), tr.type,
                               static_cast<uint32_t>(si + 7), WeightSpread::blocky);
            models.push_back(std::make_unique<Model>(path.string()));
            fixtures.emplace_back(*models.back());
        }
        for (const BackendCase& bc : cases) {
            if (bc.quantized_only && tr.is_float) continue;
            Tally tally;
            std::string skipped;
            std::printf("%-20s %-9s", bc.name.c_str(), std::string(tr.name).c_str());
            const bool complete = sweep(bc, tr.type, fixtures, tally, skipped);
            // What ran before an unsupported shape still counts.
            if (tally.checked > 0)
                for (double r : tally.ratio) std::printf(" %9.3g", r);
            if (!complete) std::printf(" unsupported: %s", skipped.c_str());
            std::printf("\n");
            INFO(tally.failures << " of " << tally.checked
                                << " outputs outside their bound; first: " << tally.first);
            CHECK(tally.failures == 0);
        }
    }
    std::fflush(stdout);
}

}  // namespace

TEST_CASE("backend ops: the CPU at every ISA level matches the float64 reference",
          "[backend_ops]") {
    // One thread: the sweep checks values; that splitting rows over threads changes no bit is
    // runtime_model_test's (and a pool of two spends the sweep's time waking its worker).
    ThreadPool pool(1);
    std::vector<BackendCase> cases;
    for (Isa isa : kIsaLevels) {
        if (isa > cpu_isa()) {  // not on this CPU, or capped by QFORGE_ISA: said in the table
            std::printf("cpu/%s: not run (this process runs at most %s: %s)\n",
                        std::string(isa_name(isa)).c_str(),
                        std::string(isa_name(cpu_isa())).c_str(), cpu_isa_description().c_str());
            continue;
        }
        for (bool int8 : {true, false}) {
            CpuBackendOptions o;
            o.isa = isa;
            o.int8_activations = int8;
            Numerics num;
            num.scalar = isa == Isa::scalar;
            num.int8_activations = int8;
            cases.push_back({"cpu/" + std::string(isa_name(isa)) + (int8 ? "/int8" : "/f32"), num,
                             int8,
                             [&pool, o](const Model& m) { return make_cpu_backend(m, pool, o); }});
        }
    }
    run_sweep(cases, "backend_ops_cpu");
}

TEST_CASE("backend ops: CUDA matches the float64 reference", "[backend_ops][cuda]") {
#ifndef QFORGE_HAVE_CUDA
    QF_SKIP("cuda: qforge was built without CUDA (configure with -DQFORGE_CUDA=ON)");
#else
    std::string why;
    if (list_gpus(&why).empty()) QF_SKIP("cuda: no CUDA device: " + why);
    // The CUDA backend's numerics (runtime/cuda_backend.hpp): products of more than 8 tokens in
    // fp16 on the tensor cores, fp16 keys and values, an online softmax; products of up to 8
    // tokens with int8 activation blocks for quantized weights (the default) or float ones.
    Numerics num;
    num.cpu_kernels = false;
    num.fp16_products = true;
    num.fp16_kv = true;
    num.online_softmax = true;
    Numerics int8 = num;
    int8.int8_activations = true;
    CudaBackendOptions exact;
    exact.int8_activations = false;
    run_sweep(
        {{"cuda/int8", int8, true, [](const Model& m) { return make_cuda_backend(m); }},
         {"cuda/f32", num, false, [exact](const Model& m) { return make_cuda_backend(m, exact); }}},
        "backend_ops_cuda");
#endif
}

}  // namespace backend_ops_test
