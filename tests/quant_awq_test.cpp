// quant/awq and the AWQ path of the layer-sequential pipeline: folding the scales leaves the
// float model's function unchanged (one block with every fold, v -> o included; the whole GQA
// stories260K model through the CPU backend's logits), the scale search picks alpha > 0 on inputs
// with outlier channels and beats RTN there, the clipping search never loses to no clipping, and
// `qforge quantize --method awq` end to end: no worse than RTN on held-out text, with the v -> o
// pair skipped (and recorded) on a model with fewer kv heads than heads.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "formats/qf.hpp"
#include "formats/qtype.hpp"
#include "quant/awq.hpp"
#include "quant/block_forward.hpp"
#include "quant/hessian.hpp"
#include "runtime/backend.hpp"
#include "runtime/thread_pool.hpp"
#include "sources/model_source.hpp"
#include "test_support.hpp"

namespace quant_awq_test {

using namespace qforge;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<float> normal_vector(size_t n, float sigma, std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0.0f, sigma);
    std::vector<float> v(n);
    for (auto& x : v) x = normal(rng);
    return v;
}

// Positive scales spread over about two orders of magnitude (exp of N(0, 1)).
std::vector<float> random_scales(size_t n, std::mt19937_64& rng) {
    std::vector<float> s = normal_vector(n, 1.0f, rng);
    for (auto& x : s) x = std::exp(x);
    return s;
}

double relative_l2(const std::vector<float>& a, const std::vector<float>& ref) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double d = double(a[i]) - ref[i];
        diff += d * d;
        norm += double(ref[i]) * ref[i];
    }
    return std::sqrt(diff / norm);
}

// One decoder block on x: runtime/transformer.hpp's block through the calibration operations,
// on b's float weights (the v bias added: small_config sets attention_bias).
// `qk_norm`: the q and k head norms of a QK-norm block (empty: none), which no fold touches.
// `post_norms`: a sandwich-norm (Gemma) block's attention and MLP output norms, untouched too.
std::vector<float> block_output(BlockForward& f, const AwqBlock& b, std::vector<float> x,
                                const std::vector<float>& qk_norm = {},
                                const std::vector<float>& post_norms = {}) {
    const ModelConfig& c = f.config();
    const uint64_t d = c.hidden_size, inter = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
    static const std::vector<float> none;
    BlockView v;
    v[Weight::q] = f32_matrix("q", b.q, qd, d);
    v[Weight::k] = f32_matrix("k", b.k, kvd, d);
    v[Weight::v] = f32_matrix("v", b.v, kvd, d);
    v[Weight::o] = f32_matrix("o", b.o, d, qd);
    v[Weight::gate] = f32_matrix("gate", b.gate, inter, d);
    v[Weight::up] = f32_matrix("up", b.up, inter, d);
    v[Weight::down] = f32_matrix("down", b.down, d, inter);
    v.norm = {&b.attn_norm, &b.mlp_norm, nullptr, &qk_norm, &qk_norm, &post_norms, &post_norms};
    v.qkv_bias = {&none, &none, &b.v_bias};
    f.view = v;
    BlockForward::Buffers buffers;
    run_block(f, f.desc(), 0, f.activations(x.data(), buffers), f.tokens());
    return x;
}

ModelConfig small_config(uint64_t kv_heads) {
    ModelConfig c;
    c.vocab_size = 16;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_layers = 1;
    c.num_heads = 4;
    c.num_kv_heads = kv_heads;
    c.head_dim = 8;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.attention_bias = true;  // the v bias is folded too (q and k biases stay empty)
    return c;
}

AwqBlock random_block(const ModelConfig& c, std::mt19937_64& rng) {
    const uint64_t d = c.hidden_size, inter = c.intermediate_size;
    AwqBlock b;
    b.attn_norm = random_scales(d, rng);
    b.mlp_norm = random_scales(d, rng);
    b.q = normal_vector(c.q_dim() * d, 0.2f, rng);
    b.k = normal_vector(c.kv_dim() * d, 0.2f, rng);
    b.v = normal_vector(c.kv_dim() * d, 0.2f, rng);
    b.v_bias = normal_vector(c.kv_dim(), 0.1f, rng);
    b.o = normal_vector(d * c.q_dim(), 0.2f, rng);
    b.gate = normal_vector(inter * d, 0.2f, rng);
    b.up = normal_vector(inter * d, 0.2f, rng);
    b.down = normal_vector(d * inter, 0.2f, rng);
    return b;
}

// The float32 values of source tensor i.
std::vector<float> tensor_f32(const ModelSource& src, size_t i) {
    std::vector<uint8_t> scratch;
    const auto bytes = src.bytes(i, scratch);
    const SourceTensor& t = src.tensors()[i];
    uint64_t count = 1;
    for (auto e : t.shape) count *= e;
    std::vector<float> v(count);
    dequantize_row_ref(t.qtype, bytes.data(), count, v.data());
    return v;
}

using qforge::test::q;

json json_of(const test::CommandResult& r) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const size_t at = r.output.find("{\n");
    REQUIRE(at != std::string::npos);
    return json::parse(r.output.substr(at));
}

}  // namespace

TEST_CASE("awq scales: x_mean^alpha, clamped, normalized by sqrt(max * min)", "[awq][quant]") {
    const std::vector<double> x_mean = {0.0, 0.5, 2.0, 8.0};
    const std::vector<float> s0 = awq_scales(x_mean, 0.0);
    for (float v : s0) REQUIRE(v == 1.0f);
    const std::vector<float> s = awq_scales(x_mean, 0.5);
    // Raw: 1e-4 (clamped), sqrt(0.5), sqrt(2), sqrt(8); norm sqrt(1e-4 * sqrt(8)).
    const double norm = std::sqrt(1e-4 * std::sqrt(8.0));
    REQUIRE(s[0] == Approx(1e-4 / norm).epsilon(1e-6));
    REQUIRE(s[2] == Approx(std::sqrt(2.0) / norm).epsilon(1e-6));
    REQUIRE(double(s[0]) * s[3] == Approx(1.0).epsilon(1e-6));
}

TEST_CASE("awq fold: one block computes the same function, every fold included", "[awq][quant]") {
    std::mt19937_64 rng(11);
    ThreadPool pool(2);
    // kv heads of 4; and a qwen3 block: QK-norm, head_dim 12 (not hidden / heads), a sliding
    // window of 4 within the sequences of 9.
    for (const auto& [kv_heads, qwen3] :
         {std::pair{4u, false}, {2u, false}, {4u, true}, {2u, true}}) {
        INFO("kv heads " << kv_heads << " of 4" << (qwen3 ? ", qwen3" : ""));
        ModelConfig c = small_config(kv_heads);
        std::vector<float> qk_norm;
        if (qwen3) {
            c.arch = Architecture::qwen3;
            c.head_dim = 12;
            c.sliding_window = 4;
            qk_norm = random_scales(c.head_dim, rng);
        }
        const uint64_t sequences = 2, seq_len = 9;
        BlockForward f(c, sequences, seq_len, pool);
        const AwqBlock b = random_block(c, rng);
        const std::vector<float> x = normal_vector(f.tokens() * c.hidden_size, 1.0f, rng);
        const std::vector<float> ref = block_output(f, b, x, qk_norm);

        AwqBlockScales s;
        s.qkv = random_scales(c.hidden_size, rng);
        s.gate_up = random_scales(c.hidden_size, rng);
        s.down = random_scales(c.intermediate_size, rng);
        AwqBlock folded = b;
        if (awq_scales_v_to_o(c)) {
            s.vo = random_scales(c.q_dim(), rng);
        } else {
            AwqBlockScales with_vo = s;
            with_vo.vo = random_scales(c.q_dim(), rng);
            REQUIRE_THROWS(awq_fold(c, folded, with_vo));
        }
        awq_fold(c, folded, s);
        REQUIRE(folded.q != b.q);
        // Each fold adds one float32 rounding to a weight (W * s) and one to its partner
        // (norm / s, v / s, up / s): a few 2^-24 relative per product term, ~1e-7 on the
        // output; 1e-5 leaves 100x for the attention's and SwiGLU's amplification, and a wrong
        // fold (a scale on the wrong axis) moves the output by O(1).
        const double err = relative_l2(block_output(f, folded, x, qk_norm), ref);
        INFO("relative L2 " << err);
        REQUIRE(err <= 1e-5);
        if (qwen3) {  // the norms matter: without them the block's output moves by O(1)
            ModelConfig no_norm = c;
            no_norm.arch = Architecture::llama;
            BlockForward g(no_norm, sequences, seq_len, pool);
            REQUIRE(relative_l2(block_output(g, b, x), ref) > 1e-2);
        }
    }
}

TEST_CASE(
    "awq fold: a Gemma block (sandwich and stored 1 + w norms, GeGLU, soft-capping, "
    "local RoPE) computes the same function",
    "[awq][quant][gemma]") {
    std::mt19937_64 rng(12);
    ThreadPool pool(2);
    for (const Architecture arch : {Architecture::gemma2, Architecture::gemma3}) {
        INFO(architecture_name(arch));
        ModelConfig c = small_config(4);  // v -> o folds too
        c.arch = arch;
        c.num_layers = 2;  // the block is layer 0: sliding (window 4 in sequences of 9)
        c.sliding_window = 4;
        c.sliding_window_pattern = 2;
        c.query_pre_attn_scalar = 24.0;
        if (arch == Architecture::gemma2) {
            c.attn_logit_softcapping = 2.0;
        } else {
            c.rope_local_theta = 100.0;
            c.rope_scaling.type = "linear";
            c.rope_scaling.factor = 8.0;
        }
        const uint64_t sequences = 2, seq_len = 9;
        BlockForward f(c, sequences, seq_len, pool);
        REQUIRE(f.desc().sandwich_norms);
        REQUIRE(f.desc().activation == Activation::gelu_tanh);
        // Gemma's norms as the .qf stores them: the multiplier 1 + w, near 1.
        const std::vector<float> qk_norm =
            arch == Architecture::gemma3 ? random_scales(c.head_dim, rng) : std::vector<float>{};
        const std::vector<float> post = random_scales(c.hidden_size, rng);
        const AwqBlock b = random_block(c, rng);
        const std::vector<float> x = normal_vector(f.tokens() * c.hidden_size, 1.0f, rng);
        const std::vector<float> ref = block_output(f, b, x, qk_norm, post);
        AwqBlockScales s;
        s.qkv = random_scales(c.hidden_size, rng);
        s.gate_up = random_scales(c.hidden_size, rng);
        s.down = random_scales(c.intermediate_size, rng);
        s.vo = random_scales(c.q_dim(), rng);
        AwqBlock folded = b;
        awq_fold(c, folded, s);
        // As for the Llama block: a few float32 roundings per fold (the post-norms see o's and
        // down's outputs, which the folds keep), far below a wrong fold's O(1).
        const double err = relative_l2(block_output(f, folded, x, qk_norm, post), ref);
        INFO("relative L2 " << err);
        REQUIRE(err <= 1e-5);
        // The post-norms are in the function: other post-norm weights move the output by O(1).
        const std::vector<float> other = random_scales(c.hidden_size, rng);
        REQUIRE(relative_l2(block_output(f, b, x, qk_norm, other), ref) > 1e-2);
    }
}

TEST_CASE("awq fold on GQA stories260K: the CPU backend's logits are unchanged",
          "[awq][quant][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("awq-fold");
    const fs::path in = test::convert_stories(data, "hf", dir);
    const auto src = open_model_source(in.string(), "");
    const ModelConfig& c = src->config();
    REQUIRE(c.num_kv_heads < c.num_heads);  // GQA: v -> o is not foldable
    REQUIRE_FALSE(awq_scales_v_to_o(c));

    std::map<std::string, size_t> index;
    for (size_t i = 0; i < src->tensors().size(); ++i) index[src->tensors()[i].name] = i;
    std::map<std::string, std::vector<float>> plain;
    for (size_t i = 0; i < src->tensors().size(); ++i)
        plain[src->tensors()[i].name] = tensor_f32(*src, i);
    std::map<std::string, std::vector<float>> folded = plain;
    std::mt19937_64 rng(5);
    for (uint64_t l = 0; l < c.num_layers; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        AwqBlock b;
        auto slot = [&](const char* suffix) -> std::vector<float>& { return folded[p + suffix]; };
        b.attn_norm = slot("attn_norm");
        b.mlp_norm = slot("mlp_norm");
        b.q = slot("attn.q");
        b.k = slot("attn.k");
        b.v = slot("attn.v");
        b.o = slot("attn.o");
        b.gate = slot("mlp.gate");
        b.up = slot("mlp.up");
        b.down = slot("mlp.down");
        AwqBlockScales s;
        s.qkv = random_scales(c.hidden_size, rng);
        s.gate_up = random_scales(c.hidden_size, rng);
        s.down = random_scales(c.intermediate_size, rng);
        awq_fold(c, b, s);
        slot("attn_norm") = b.attn_norm;
        slot("mlp_norm") = b.mlp_norm;
        slot("attn.q") = b.q;
        slot("attn.k") = b.k;
        slot("attn.v") = b.v;
        slot("attn.o") = b.o;
        slot("mlp.gate") = b.gate;
        slot("mlp.up") = b.up;
        slot("mlp.down") = b.down;
    }
    auto write = [&](const fs::path& path, const std::map<std::string, std::vector<float>>& w) {
        QfWriter out(path.string());
        out.set_model(src->model_json());
        out.set_tokenizer(src->tokenizer());
        for (const auto& t : src->tensors())
            out.add_tensor(t.name, QType::f32, t.shape,
                           test::float_bytes(QType::f32, w.at(t.name)));
        out.finish();
    };
    write(dir / "plain.qf", plain);
    write(dir / "folded.qf", folded);

    Model a((dir / "plain.qf").string()), b((dir / "folded.qf").string());
    ThreadPool pool(2);
    auto ca = make_cpu_backend(a, pool), cb = make_cpu_backend(b, pool);
    const uint64_t len = 48;
    std::vector<int32_t> tokens(len);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
    std::vector<float> la(len * c.vocab_size), lb(la.size());
    auto cache_a = ca->new_cache(len), cache_b = cb->new_cache(len);
    ca->forward(tokens, *cache_a, 0, la);
    cb->forward(tokens, *cache_b, 0, lb);
    // The block bound above (1e-5, ~1e-7 expected per block), through 5 blocks and the head.
    const double err = relative_l2(lb, la);
    INFO("relative L2 of the logits " << err);
    REQUIRE(err <= 1e-5);
}

TEST_CASE("awq scale search: alpha > 0 on outlier channels, and better than RTN", "[awq][quant]") {
    std::mt19937_64 rng(3);
    const uint64_t n = 512, k = 128, rows = 48;
    for (QType t : {QType::q4_g32, QType::q3_g32}) {
        INFO(qtype_traits(t).name);
        // Inputs: most channels ~N(0, 1), every 16th one 20x larger (the salient channels).
        std::vector<float> x = normal_vector(n * k, 1.0f, rng);
        for (uint64_t i = 0; i < n; ++i)
            for (uint64_t c = 0; c < k; c += 16) x[i * k + c] *= 20.0f;
        const std::vector<float> w = normal_vector(rows * k, 0.05f, rng);
        HessianAccumulator acc(k);
        acc.add(x.data(), n);
        const HessianStats hs = acc.finish();
        const AwqScaleSearch r =
            awq_search_scales(hs.mean_abs, {{w.data(), rows, t}}, k,
                              [&](const std::vector<std::vector<float>>& cand) {
                                  return awq_hessian_error(w.data(), cand[0].data(), rows, k, hs.h);
                              });
        REQUIRE(r.errors.size() == size_t(kAwqScaleGrid));
        INFO("alpha " << r.alpha << ", error " << r.error() << ", RTN " << r.rtn_error());
        REQUIRE(r.alpha > 0.0);
        // AWQ / RTN error measured 0.31 and 0.36 on these fixed-seed inputs; 0.55 is about 1.5x
        // the worst, so a search that finds half of the salient channels' benefit fails.
        REQUIRE(r.error() < 0.55 * r.rtn_error());

        // alpha = 0 is RTN itself: the reference quantizer's rows.
        std::vector<float> fq(rows * k), ref(rows * k);
        awq_fake_quantize(t, w.data(), rows, k, nullptr, fq.data());
        std::vector<uint8_t> row(*qtype_row_bytes(t, k));
        for (uint64_t r0 = 0; r0 < rows; ++r0) {
            REQUIRE(quantize_row_ref(t, w.data() + r0 * k, k, row.data()) == QuantStatus::ok);
            dequantize_row_ref(t, row.data(), k, ref.data() + r0 * k);
        }
        REQUIRE(fq == ref);
        REQUIRE(r.rtn_error() == Approx(awq_hessian_error(w.data(), ref.data(), rows, k, hs.h)));
    }
}

TEST_CASE("awq clipping: never worse than the unclipped group, and clips outlier groups",
          "[awq][quant]") {
    std::mt19937_64 rng(9);
    const uint64_t n = 256, k = 96, rows = 16;  // k: three groups of 32
    std::vector<float> x = normal_vector(n * k, 1.0f, rng);
    std::vector<float> w = normal_vector(rows * k, 0.05f, rng);
    for (uint64_t r = 0; r < rows; r += 2) w[r * k + (r * 7) % k] = 0.6f;  // an outlier weight
    HessianAccumulator acc(k);
    acc.add(x.data(), n);
    const HessianStats hs = acc.finish();
    for (QType t : {QType::q4_g32, QType::q4s_g32, QType::q3_g32}) {
        INFO(qtype_traits(t).name);
        std::vector<float> wc = w, q0(rows * k), q1(rows * k);
        const AwqClipStats st = awq_clip(t, wc.data(), rows, k, hs.h);
        REQUIRE(st.groups == rows * 3);
        REQUIRE(st.clipped > 0);
        awq_fake_quantize(t, w.data(), rows, k, nullptr, q0.data());
        awq_fake_quantize(t, wc.data(), rows, k, nullptr, q1.data());
        // Errors against the unclipped weights: groups are independent on H's diagonal blocks
        // only, so the whole-H error is not guaranteed to fall; on these fixed-seed inputs it
        // falls to 0.92 .. 0.97 of the unclipped error, so a clip that makes it worse fails.
        const double e0 = awq_hessian_error(w.data(), q0.data(), rows, k, hs.h);
        const double e1 = awq_hessian_error(w.data(), q1.data(), rows, k, hs.h);
        INFO("unclipped " << e0 << ", clipped " << e1);
        REQUIRE(e1 <= e0);
    }
}

TEST_CASE("qforge quantize --method awq on stories260K: no worse than RTN, v -> o skipped",
          "[awq][quant][cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("awq-cli");
    const fs::path in = test::convert_stories(data, "hf", dir);
    const std::string text = test::tinystories_head(data);
    // Calibrate on the first 40%, evaluate on the last 40%: never overlapping.
    const size_t cut = text.size() * 2 / 5;
    test::write_file(dir / "calib.txt", std::string(text.begin(), text.begin() + cut));
    test::write_file(dir / "eval.txt", std::string(text.end() - cut, text.end()));

    const std::string common = " --qtype q4_g32 --threads 2 ";
    const auto rtn = test::run_qforge("quantize " + q(in) + " -o " + q(dir / "rtn.qf") + common);
    REQUIRE(rtn.exit_code == 0);
    const auto awq = test::run_qforge("quantize " + q(in) + " -o " + q(dir / "awq.qf") + common +
                                      "--method awq --calib " + q(dir / "calib.txt") +
                                      " --nsamples 16 --seqlen 128");
    INFO(awq.output);
    REQUIRE(awq.exit_code == 0);

    const QfFile qf((dir / "awq.qf").string());
    const json& rec = qf.header()["provenance"]["quantization"]["awq"];
    REQUIRE(rec["method"] == "awq");
    const json& blocks = rec["awq"]["blocks"];
    REQUIRE(blocks.size() == 5);
    for (const auto& b : blocks) {
        REQUIRE_THAT(b["groups"]["vo"]["skipped"].get<std::string>(),
                     Catch::Contains("num_kv_heads < num_heads"));
        for (const char* g : {"qkv", "gate_up", "down"}) {
            REQUIRE(b["groups"][g]["error"].get<double>() <=
                    b["groups"][g]["rtn_error"].get<double>());
        }
    }

    // 16 chunks of 128 and 16 calibration samples (were 40 and 32, for the sanitizer build's
    // time): AWQ's KLD is then 0.065 against RTN's 0.072, 10% lower, a clear margin.
    auto ppl = [&](const char* model) {
        return json_of(test::run_qforge("ppl " + q(dir / model) + " -f " + q(dir / "eval.txt") +
                                        " --protocol llamacpp --ctx 128 --chunks 16 --kl-base " +
                                        q(in) + " --json"));
    };
    const json pr = ppl("rtn.qf"), pa = ppl("awq.qf");
    INFO("RTN: ppl " << pr["ppl"] << " kld " << pr["kld"] << "; AWQ: ppl " << pa["ppl"] << " kld "
                     << pa["kld"]);
    REQUIRE(pa["kld"].get<double>() <= pr["kld"].get<double>());
}

}  // namespace quant_awq_test
