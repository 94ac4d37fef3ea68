// The quantization recipe (quant/recipe.hpp): parsing the CLI's values, the default policy per
// tensor class, the size rule and the overrides; and RTN (quant/rtn.hpp) against the reference
// quantizer, whatever the thread count.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>

#include "core/half.hpp"
#include "formats/architectures.hpp"
#include "quant/quantize_model.hpp"
#include "quant/recipe.hpp"
#include "quant/rtn.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

namespace quant_recipe_test {

using namespace qforge;
using Catch::Contains;

namespace {

QuantRecipe recipe(QType t, std::vector<std::string> overrides = {}) {
    QuantRecipe r;
    r.qtype = t;
    for (const auto& o : overrides) r.overrides.push_back(parse_tensor_type_override(o));
    return r;
}

TensorChoice choose(const QuantRecipe& r, const std::string& name, std::vector<uint64_t> shape,
                    QType source = QType::f32, bool tied = false) {
    return choose_tensor_qtype(r, name, shape, source, tied);
}

std::vector<float> random_weights(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.02f);
    std::vector<float> w(n);
    for (auto& x : w) x = d(rng);
    return w;
}

}  // namespace

TEST_CASE("recipe values: qtype names, methods, --tensor-type", "[quant][recipe]") {
    REQUIRE(parse_qtype_name("q4_g128") == QType::q4_g128);
    for (const auto& row : kQTypes) REQUIRE(parse_qtype_name(row.name) == row.type);
    // The error lists every valid name, from the table.
    REQUIRE_THROWS_WITH(parse_qtype_name("q5"),
                        Contains("unknown qtype 'q5'") && Contains(qtype_names()));
    REQUIRE_THAT(qtype_names(), Contains("f32, f16, bf16, q8,") && Contains("q4s_g128"));
    // Families stand for their member; a type's name is that type; unknown names list both.
    REQUIRE(parse_qtype_name("q4") == QType::q4k_g32);
    REQUIRE(parse_qtype_name("q3") == QType::q3k_g32);
    REQUIRE(parse_qtype_name("q8") == QType::q8);
    REQUIRE(qtype_family_names() == "q3 = q3k_g32, q4 = q4k_g32, q8 = q8");
    REQUIRE_THROWS_WITH(parse_qtype_name("q2"), Contains("families: " + qtype_family_names()));
    REQUIRE(parse_tensor_type_override("down=q4").qtype == QType::q4k_g32);

    REQUIRE(parse_quant_method("rtn") == QuantMethod::rtn);
    REQUIRE(parse_quant_method("gptq") == QuantMethod::gptq);
    REQUIRE(parse_quant_method("awq") == QuantMethod::awq);
    REQUIRE(parse_quant_method("awq+gptq") == QuantMethod::awq_gptq);
    REQUIRE_THROWS_WITH(parse_quant_method("xyz"), Contains("valid: rtn, gptq, awq, awq+gptq"));

    const TensorTypeOverride o = parse_tensor_type_override("mlp\\.down=q8_g32");
    REQUIRE(o.qtype == QType::q8_g32);
    REQUIRE(o.text == "mlp\\.down=q8_g32");
    // The last '=' splits: a regex may contain '='.
    REQUIRE(std::regex_search("a=b", parse_tensor_type_override("a=b=q8").regex));
    REQUIRE_THROWS_WITH(parse_tensor_type_override("mlp"), Contains("expected REGEX=TYPE"));
    REQUIRE_THROWS_WITH(parse_tensor_type_override("=q8"), Contains("regex before '=' is empty"));
    REQUIRE_THROWS_WITH(parse_tensor_type_override("attn(=q8"), Contains("bad regex 'attn('"));
    REQUIRE_THROWS_WITH(parse_tensor_type_override("attn=q5"),
                        Contains("unknown qtype 'q5'") && Contains("q4s_g128"));
}

TEST_CASE("every architecture names the embedding and output head as the policy expects",
          "[quant][recipe]") {
    for (Architecture a : {Architecture::llama, Architecture::mistral, Architecture::qwen2}) {
        bool embed = false, lm_head = false;
        for (const auto& row : tensor_rows(a)) {
            embed |= row.name_pattern == kEmbedTensor;
            lm_head |= row.name_pattern == kLmHeadTensor;
        }
        INFO(architecture_name(a));
        REQUIRE(embed);
        REQUIRE(lm_head);
    }
}

TEST_CASE("default policy per tensor class", "[quant][recipe]") {
    const std::vector<uint64_t> mat = {256, 512};
    SECTION("4-bit default: output head at 8 bits, untied embedding at the default") {
        const QuantRecipe r = recipe(QType::q4_g128);
        REQUIRE(choose(r, "layers.0.attn.q", mat).qtype == QType::q4_g128);
        REQUIRE(choose(r, "layers.0.attn.q", mat).cls == TensorClass::linear);
        REQUIRE(choose(r, "layers.3.mlp.down", mat, QType::bf16).qtype == QType::q4_g128);
        REQUIRE(choose(r, "lm_head", mat).qtype == kOutputHeadQType);
        REQUIRE(choose(r, "lm_head", mat).cls == TensorClass::lm_head);
        REQUIRE(choose(r, "embed", mat).qtype == QType::q4_g128);
        REQUIRE(choose(r, "embed", mat).cls == TensorClass::embed);
        // Tied: the embedding is the output head.
        REQUIRE(choose(r, "embed", mat, QType::f32, true).qtype == kOutputHeadQType);
        REQUIRE(choose(r, "embed", mat, QType::f32, true).cls == TensorClass::tied_embed);
        // 1-D tensors: f32 whatever the source float type.
        for (QType src : {QType::f32, QType::f16, QType::bf16}) {
            REQUIRE(choose(r, "layers.0.attn_norm", {512}, src).qtype == QType::f32);
            REQUIRE(choose(r, "layers.0.attn.q_bias", {512}, src).cls == TensorClass::vector);
            REQUIRE(choose(r, "final_norm", {512}, src).qtype == QType::f32);
        }
        REQUIRE(choose(r, "layers.0.attn.q", mat).override_index == -1);
    }
    SECTION("symmetric 4-bit default too") {
        REQUIRE(choose(recipe(QType::q4s_g32), "lm_head", mat).qtype == kOutputHeadQType);
    }
    SECTION("8-bit and float defaults apply everywhere but 1-D tensors") {
        for (QType d : {QType::q8, QType::q8_g128, QType::f16, QType::bf16}) {
            const QuantRecipe r = recipe(d);
            REQUIRE(choose(r, "lm_head", mat).qtype == d);
            REQUIRE(choose(r, "embed", mat, QType::f32, true).qtype == d);
            REQUIRE(choose(r, "layers.1.mlp.up", mat).qtype == d);
            REQUIRE(choose(r, "layers.1.mlp_norm", {512}).qtype == QType::f32);
        }
    }
    SECTION("a row too short to gain from packing keeps its float type") {
        const QuantRecipe r = recipe(QType::q4_g128);
        // k = 8: one 64-byte packed row for 8 weights is 64 bits per weight, twice f32's 32 (the
        // rule counts rows padded to 64 bytes, as format version 1 stored them).
        const TensorChoice c = choose(r, "layers.0.attn.k", {4, 8});
        REQUIRE(c.qtype == QType::f32);
        REQUIRE_THAT(c.reason, Contains("rows of 8 weights") && Contains("kept f32"));
        // k = 32 from f16: 16 bits per weight packed, 16 as f16: kept; from f32 it pays.
        REQUIRE(choose(r, "layers.0.attn.k", {4, 32}, QType::f16).qtype == QType::f16);
        REQUIRE(choose(r, "layers.0.attn.k", {4, 32}, QType::f32).qtype == QType::q4_g128);
        REQUIRE(choose(r, "layers.0.attn.k", {4, 64}, QType::f16).qtype == QType::q4_g128);
        // The bound is the table's own bits per weight (padded rows), not a constant of the
        // policy.
        REQUIRE(qtype_bits_per_weight(QType::q4_g128, 32, kQfV1RowAlign) == 16.0);
    }
    SECTION("a stored quantized tensor is left to the pipeline (copy or refusal)") {
        REQUIRE(choose(recipe(QType::q4_g128), "layers.0.attn.q", {4, 8}, QType::q4_g128).qtype ==
                QType::q4_g128);
    }
}

TEST_CASE("overrides: regex_search, first match wins, quantized types need a matrix",
          "[quant][recipe]") {
    const std::vector<uint64_t> mat = {256, 512};
    const QuantRecipe r =
        recipe(QType::q4_g128, {"attn\\.(q|k)$=q8", "attn=q8_g128", "^layers\\.1\\.=q4s_g32",
                                "norm=f16", "^embed$=q4_g32"});
    // Found anywhere in the name, not a full match.
    REQUIRE(choose(r, "layers.0.attn.q", mat).qtype == QType::q8);
    REQUIRE(choose(r, "layers.0.attn.q", mat).override_index == 0);
    REQUIRE_THAT(choose(r, "layers.0.attn.q", mat).reason, Contains("attn\\.(q|k)$=q8"));
    REQUIRE(choose(r, "layers.0.attn.v", mat).qtype == QType::q8_g128);
    // The first match wins: layers.1's attention takes rule 0 or 1, its MLP rule 2.
    REQUIRE(choose(r, "layers.1.attn.k", mat).qtype == QType::q8);
    REQUIRE(choose(r, "layers.1.attn.o", mat).qtype == QType::q8_g128);
    REQUIRE(choose(r, "layers.1.mlp.up", mat).qtype == QType::q4s_g32);
    REQUIRE(choose(r, "layers.11.mlp.up", mat).qtype == QType::q4_g128);  // "^layers\.1\." only
    // A quantized override skips 1-D tensors (attn=q8_g128 does not touch attn_norm or q_bias),
    // a float override reaches them.
    REQUIRE(choose(r, "layers.0.attn.q_bias", {512}).qtype == QType::f32);
    REQUIRE(choose(r, "layers.0.attn_norm", {512}).qtype == QType::f16);
    REQUIRE(choose(r, "layers.0.attn_norm", {512}).override_index == 3);
    // An override beats the output-head rule and the size rule.
    REQUIRE(choose(r, "embed", mat, QType::f32, true).qtype == QType::q4_g32);
    REQUIRE(choose(r, "layers.0.attn.q", {4, 8}).qtype == QType::q8);

    const nlohmann::json j = recipe_to_json(r);
    REQUIRE(j["method"] == "rtn");
    REQUIRE(j["qtype"] == "q4_g128");
    REQUIRE(j["overrides"].size() == 5);
    REQUIRE(j["overrides"][0] == "attn\\.(q|k)$=q8");
}

TEST_CASE("rtn_quantize equals quantize_row_ref row by row, whatever the thread count",
          "[quant][rtn]") {
    // Odd shapes: k not a multiple of any group, a single row, more threads than rows.
    for (auto [rows, k] : {std::pair<uint64_t, uint64_t>{17, 100}, {1, 33}, {2, 300}, {5, 7}}) {
        const std::vector<float> w =
            random_weights(rows * k, static_cast<uint32_t>(rows * 1000 + k));
        for (QType src : {QType::f32, QType::f16, QType::bf16}) {
            const std::vector<uint8_t> in = test::float_bytes(src, w);
            const uint64_t in_row = *qtype_row_bytes(src, k);
            for (const auto& tr : kQTypes) {
                INFO(tr.name << " from " << qtype_traits(src).name << ", " << rows << " x " << k);
                const uint64_t out_row = *qtype_row_bytes(tr.type, k);
                // The reference: each row decoded to float by hand, then quantize_row_ref.
                std::vector<uint8_t> want(rows * out_row, 0xcd);
                for (uint64_t r = 0; r < rows; ++r) {
                    std::vector<float> row(k);
                    for (uint64_t j = 0; j < k; ++j) {
                        const uint8_t* p = in.data() + r * in_row;
                        if (src == QType::f32) {
                            std::memcpy(&row[j], p + 4 * j, 4);
                        } else {
                            uint16_t h;
                            std::memcpy(&h, p + 2 * j, 2);
                            row[j] = src == QType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
                        }
                    }
                    REQUIRE(quantize_row_ref(tr.type, row.data(), k, want.data() + r * out_row) ==
                            QuantStatus::ok);
                }
                for (int threads : {1, 3}) {
                    ThreadPool pool(threads);
                    std::vector<uint8_t> got(rows * out_row, 0x5a);  // poisoned
                    REQUIRE_FALSE(rtn_quantize(src, in, rows, k, tr.type, got, &pool));
                    REQUIRE(got == want);
                }
            }
        }
    }
}

TEST_CASE("rtn_quantize reports the lowest bad row whatever the thread count", "[quant][rtn]") {
    const uint64_t rows = 40, k = 70;
    std::vector<float> w = random_weights(rows * k, 7);
    w[31 * k + 2] = INFINITY;  // in the last thread's part
    w[9 * k + 5] = std::nanf("");
    w[9 * k + 60] = std::nanf("");
    const std::vector<uint8_t> in = test::float_bytes(QType::f32, w);
    for (int threads : {1, 2, 3, 8}) {
        ThreadPool pool(threads);
        std::vector<uint8_t> out(
            *qtype_tensor_bytes(QType::q4_g32, std::vector<uint64_t>{rows, k}));
        const auto f = rtn_quantize(QType::f32, in, rows, k, QType::q4_g32, out, &pool);
        REQUIRE(f);
        REQUIRE(f->status == QuantStatus::non_finite);
        REQUIRE(f->row == 9);
        REQUIRE(f->col == 5);
        REQUIRE(std::isnan(f->value));
    }

    // A weight whose group scale cannot be an fp16: the largest |w| of the row is named.
    std::vector<float> big = random_weights(3 * 64, 8);
    big[64 + 17] = -9.0e5f;
    std::vector<uint8_t> out(*qtype_tensor_bytes(QType::q4s_g32, std::vector<uint64_t>{3, 64}));
    auto f = rtn_quantize(QType::f32, test::float_bytes(QType::f32, big), 3, 64, QType::q4s_g32,
                          out, nullptr);
    REQUIRE(f);
    REQUIRE(f->status == QuantStatus::scale_overflow);
    REQUIRE(f->row == 1);
    REQUIRE(f->col == 17);
    REQUIRE(f->value == -9.0e5f);
    // f32 -> f16 overflow is the same status.
    big[64 + 17] = 1.0e5f;
    out.assign(3 * 64 * 2, 0);
    f = rtn_quantize(QType::f32, test::float_bytes(QType::f32, big), 3, 64, QType::f16, out,
                     nullptr);
    REQUIRE(f);
    REQUIRE(f->status == QuantStatus::scale_overflow);
    REQUIRE(f->row == 1);
}

TEST_CASE("method options: the table's defaults, then the command line's choices",
          "[quant][recipe]") {
    auto resolved = [](QuantMethod m, const MethodChoices& c, bool text) {
        CalibratedOptions o;
        if (text) o.calibration.files = {"calib.txt"};
        resolve_method_options(m, c, o);
        return o;
    };
    for (const QuantMethodInfo& info : kQuantMethods) {
        CAPTURE(info.name);
        const CalibratedOptions o = resolved(info.method, {}, true);
        REQUIRE(o.importance == info.defaults.importance);
        REQUIRE(o.act_order == info.defaults.act_order);
        REQUIRE(o.damp == info.defaults.damp);
        REQUIRE(o.refit == info.defaults.refit);
        REQUIRE(o.calibration.nsamples == info.defaults.nsamples);
        REQUIRE(o.mse == 0.0);
        // Every choice given wins over the default.
        MethodChoices c;
        c.act_order = !info.defaults.act_order;
        c.damp = 0.25;
        c.nsamples = 7;
        c.mse = true;
        // (RTN without importance has no use for text: given none.)
        const CalibratedOptions x = resolved(info.method, c, info.calibrated);
        REQUIRE(x.act_order == !info.defaults.act_order);
        REQUIRE(x.damp == 0.25);
        REQUIRE(x.calibration.nsamples == 7);
        // An explicit --mse replaces the default importance search.
        REQUIRE(x.mse == kGptqMseNorm);
        REQUIRE_FALSE(x.importance);
    }
    // RTN weighs by importance only with calibration text, and has no other use for it.
    REQUIRE_FALSE(resolved(QuantMethod::rtn, {}, false).importance);
    REQUIRE(resolved(QuantMethod::rtn, {}, true).importance ==
            quant_method_info(QuantMethod::rtn).defaults.importance);
    MethodChoices on, off, both;
    on.importance = true;
    off.importance = false;
    both.importance = both.mse = true;
    REQUIRE_THROWS_WITH(resolved(QuantMethod::rtn, on, false),
                        "--method rtn --importance needs calibration text: --calib FILE");
    REQUIRE_THROWS_WITH(resolved(QuantMethod::rtn, off, true),
                        Contains("--no-importance reads no calibration text"));
    REQUIRE_FALSE(resolved(QuantMethod::gptq, off, true).importance);
    REQUIRE_THROWS_WITH(resolved(QuantMethod::gptq, both, true),
                        Contains("--importance and --mse choose each group's grid differently"));
    // The refit moves GPTQ's grids: the methods without GPTQ refuse it, the others turn it off.
    MethodChoices refit, no_refit;
    refit.refit = true;
    no_refit.refit = false;
    REQUIRE(resolved(QuantMethod::awq_gptq, refit, true).refit);
    REQUIRE_FALSE(resolved(QuantMethod::gptq, no_refit, true).refit);
    REQUIRE_THROWS_WITH(resolved(QuantMethod::awq, refit, true),
                        "--method awq --refit refits GPTQ's grids: use --method gptq or awq+gptq");
    REQUIRE_THROWS_WITH(resolved(QuantMethod::rtn, refit, true), Contains("--refit refits GPTQ"));
}

}  // namespace quant_recipe_test
