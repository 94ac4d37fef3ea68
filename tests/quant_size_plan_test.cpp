// The size plan (quant/size_plan.hpp): the budget allocation against exhaustive search, the
// sensitivity measurement against the CPU backend's forward of a float model holding the
// quantized tensor's values with a float64 divergence, and `quantize --target-size/--target-bpw`
// end to end on stories260K.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "cli_support.hpp"
#include "formats/qf.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "qf_support.hpp"
#include "quant/rtn.hpp"
#include "quant/size_plan.hpp"
#include "runtime/backend.hpp"
#include "runtime/model.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

namespace quant_size_plan_test {

using namespace qforge;

namespace {

// Every combination: the least sum of kld within the budget (ties: any), or none.
std::optional<double> brute_force(const std::vector<SizeItem>& items, uint64_t budget) {
    std::optional<double> best;
    std::vector<size_t> at(items.size(), 0);
    while (true) {
        uint64_t bytes = 0;
        double kld = 0.0;
        for (size_t i = 0; i < items.size(); ++i) {
            bytes += items[i].candidates[at[i]].bytes;
            kld += items[i].candidates[at[i]].kld;
        }
        if (bytes <= budget && (!best || kld < *best)) best = kld;
        size_t i = 0;
        while (i < items.size() && ++at[i] == items[i].candidates.size()) at[i++] = 0;
        if (i == items.size()) return best;
    }
}

std::vector<SizeItem> random_items(std::mt19937& rng, size_t n, uint64_t max_bytes) {
    std::vector<SizeItem> items(n);
    std::uniform_int_distribution<uint64_t> bytes(1, max_bytes);
    std::uniform_real_distribution<double> kld(0.0, 1.0);
    for (size_t i = 0; i < n; ++i) {
        items[i].name = "t" + std::to_string(i);
        const size_t k = 1 + rng() % 4;
        for (size_t c = 0; c < k; ++c)
            items[i].candidates.push_back({QType::q4_g32, bytes(rng), kld(rng)});
    }
    return items;
}

// The least and the most bytes any plan takes.
std::pair<uint64_t, uint64_t> byte_bounds(const std::vector<SizeItem>& items) {
    uint64_t least = 0, most = 0;
    for (const auto& it : items) {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (const auto& c : it.candidates) lo = std::min(lo, c.bytes), hi = std::max(hi, c.bytes);
        least += lo;
        most += hi;
    }
    return {least, most};
}

// A plan's bytes and summed divergence.
std::pair<uint64_t, double> totals(const std::vector<SizeItem>& items,
                                   const std::vector<size_t>& plan) {
    uint64_t bytes = 0;
    double kld = 0.0;
    for (size_t i = 0; i < items.size(); ++i) {
        bytes += items[i].candidates[plan[i]].bytes;
        kld += items[i].candidates[plan[i]].kld;
    }
    return {bytes, kld};
}

}  // namespace

TEST_CASE("size plan: the allocation is the exhaustive search's optimum", "[quant][size_plan]") {
    std::mt19937 rng(11);
    for (int trial = 0; trial < 300; ++trial) {
        // Budgets below 2^18 bytes: one unit is one byte, so the plan is exact.
        const auto items = random_items(rng, 1 + rng() % 7, 5000);
        const auto [least, most] = byte_bounds(items);
        const uint64_t budget =
            least > 0 && trial % 10 == 0 ? least - 1 : least + rng() % (most - least + 1);
        INFO("trial " << trial << ", budget " << budget);
        const auto plan = allocate_budget(items, budget);
        const auto best = brute_force(items, budget);
        REQUIRE(plan.has_value() == best.has_value());
        if (!plan) continue;
        const auto [bytes, kld] = totals(items, *plan);
        REQUIRE(bytes <= budget);
        // The same additions in possibly another order: within a few ulps of the sum.
        REQUIRE(kld == Approx(*best).epsilon(1e-12).margin(1e-12));
    }
}

TEST_CASE("size plan: large budgets stay within the budget and near the optimum",
          "[quant][size_plan]") {
    std::mt19937 rng(12);
    for (int trial = 0; trial < 40; ++trial) {
        // Megabyte tensors: units of budget / 2^18 bytes, each tensor rounded up to whole units.
        const size_t n = 1 + rng() % 6;
        const auto items = random_items(rng, n, 40'000'000);
        const auto [least, most] = byte_bounds(items);
        const uint64_t budget = least + rng() % (most - least + 1);
        const auto plan = allocate_budget(items, budget);
        REQUIRE(plan);  // feasible in bytes: a plan, if only the smallest types
        const auto [bytes, kld] = totals(items, *plan);
        REQUIRE(bytes <= budget);
        // Rounding up wastes less than one unit per tensor: the plan is at least as good as the
        // exact optimum of a budget smaller by n units.
        const uint64_t unit = (budget + (1u << 18) - 1) >> 18;
        if (budget >= n * unit + least) {
            const auto bound = brute_force(items, budget - n * unit);
            REQUIRE(bound);
            REQUIRE(kld <= *bound + 1e-12);
        }
    }
}

TEST_CASE("size plan: misuse is an error naming the tensor", "[quant][size_plan]") {
    std::vector<SizeItem> items(1);
    items[0].name = "layers.0.attn.q";
    REQUIRE_THROWS_WITH(allocate_budget(items, 100), Catch::Contains("layers.0.attn.q"));
    items[0].candidates.push_back({QType::q8, 10, std::nan("")});
    REQUIRE_THROWS_WITH(allocate_budget(items, 100), Catch::Contains("not finite"));
}

namespace {

// A float .qf equal to `model`'s file except tensor `name`, which holds `values` (f32).
void write_with_tensor(const Model& model, const std::string& name,
                       const std::vector<float>& values, const std::filesystem::path& out) {
    const QfFile& in = model.file();
    QfWriter w(out.string());
    w.set_model(in.model());
    w.set_tokenizer(in.tokenizer());
    std::vector<uint8_t> scratch;
    for (const auto& t : in.tensors()) {
        if (t.name == name) {
            REQUIRE(t.qtype == QType::f32);
            w.add_tensor(t.name, QType::f32, t.shape,
                         {reinterpret_cast<const uint8_t*>(values.data()), values.size() * 4});
        } else {
            w.add_tensor(t.name, t.qtype, t.shape, in.tensor_bytes(t, scratch));
        }
    }
    w.finish();
}

// Logits of every sequence by the CPU backend, [sequences * seq_len][vocab].
std::vector<float> backend_logits(const Model& model, const std::vector<int32_t>& tokens,
                                  uint64_t seq_len, ThreadPool& pool) {
    const uint64_t v = model.config().vocab_size;
    auto cpu = make_cpu_backend(model, pool);
    std::vector<float> out(tokens.size() * v);
    for (uint64_t s = 0; s * seq_len < tokens.size(); ++s) {
        auto cache = cpu->new_cache(seq_len);
        cpu->forward({tokens.data() + s * seq_len, seq_len}, *cache, 0,
                     {out.data() + s * seq_len * v, seq_len * v});
    }
    return out;
}

// Mean KL(p || q) over tokens, float64.
double kl64(const std::vector<float>& p, const std::vector<float>& q, uint64_t v) {
    double total = 0.0;
    const uint64_t n = p.size() / v;
    for (uint64_t t = 0; t < n; ++t) {
        auto lse = [&](const float* l) {
            double mx = l[0], s = 0.0;
            for (uint64_t i = 0; i < v; ++i) mx = std::max(mx, double(l[i]));
            for (uint64_t i = 0; i < v; ++i) s += std::exp(double(l[i]) - mx);
            return mx + std::log(s);
        };
        const float *a = p.data() + t * v, *b = q.data() + t * v;
        const double la = lse(a), lb = lse(b);
        for (uint64_t i = 0; i < v; ++i) {
            const double lpa = a[i] - la, lpb = b[i] - lb;
            total += std::exp(lpa) * (lpa - lpb);
        }
    }
    return total / double(n);
}

}  // namespace

TEST_CASE(
    "size plan: each tensor's divergence equals the CPU backend's on a float model "
    "holding its RTN values",
    "[quant][size_plan][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("size-plan");
    const Model model(test::convert_stories(data, "hf", dir).string());
    const ModelConfig& c = model.config();
    CalibrationSet calib;
    calib.nsamples = 3;
    calib.seqlen = 48;
    std::mt19937 rng(5);
    for (uint64_t i = 0; i < calib.nsamples * calib.seqlen; ++i)
        calib.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    // 100 tokens: the first two windows.
    const std::vector<QType> types = {QType::q3k_g32, QType::q8};
    const std::vector<SensitivityRequest> requests = {
        {model.weight(2, Weight::down).name, types},
        {model.weight(0, Weight::k).name, types},
        {model.embed().name, types}};  // tied: the lookup and the head
    ThreadPool pool(2);
    const auto items = measure_sensitivity(model, calib, 100, requests, pool);
    REQUIRE(items.size() == requests.size());

    const std::vector<int32_t> tokens(calib.tokens.begin(), calib.tokens.begin() + 96);
    const auto base = backend_logits(model, tokens, calib.seqlen, pool);
    for (size_t r = 0; r < requests.size(); ++r) {
        const QfTensorInfo& t = model.file().at(requests[r].name);
        const uint64_t rows = t.shape[0], k = t.shape[1];
        std::vector<uint8_t> scratch;
        const auto src = model.file().tensor_bytes(t, scratch);
        REQUIRE(items[r].candidates.size() == types.size());
        for (size_t j = 0; j < types.size(); ++j) {
            const QType q = types[j];
            INFO(requests[r].name << " as " << qtype_traits(q).name);
            std::vector<uint8_t> packed(*qtype_tensor_bytes(q, t.shape));
            REQUIRE_FALSE(rtn_quantize(QType::f32, src, rows, k, q, packed, nullptr));
            std::vector<float> deq(rows * k);
            for (uint64_t i = 0; i < rows; ++i)
                dequantize_row_ref(q, packed.data() + i * *qtype_row_bytes(q, k), k,
                                   deq.data() + i * k);
            const auto path = dir.path() / "one.qf";
            write_with_tensor(model, requests[r].name, deq, path);
            const Model one(path.string());
            const double expected =
                kl64(base, backend_logits(one, tokens, calib.seqlen, pool), c.vocab_size);
            const SizeCandidate& got = items[r].candidates[j];
            REQUIRE(got.qtype == q);
            REQUIRE(got.bytes % 64 == 0);
            REQUIRE(got.bytes >= packed.size());
            REQUIRE(got.bytes < packed.size() + 64);
            // Two float32 forwards with different summation orders (sgemm against the backend's
            // fixed-order dots, 1e-5 relative in logits: quant_block_forward_test) and float32
            // reference probabilities: each token's divergence moves by at most about
            // 2 max|delta logit|, ~1e-5 nats here; 5e-5 plus 1% of the value catches a wrong
            // tensor, window or head (those change it by far more).
            REQUIRE(expected > 1e-6);
            REQUIRE(got.kld == Approx(expected).epsilon(0.01).margin(5e-5));
        }
        // More bits, less divergence.
        REQUIRE(items[r].candidates[1].kld < items[r].candidates[0].kld);
    }
    // A quantized tensor and an unknown name are refused by name.
    REQUIRE_THROWS_WITH(measure_sensitivity(model, calib, 100, {{"layers.0.attn.x", types}}, pool),
                        Catch::Contains("layers.0.attn.x"));
}

namespace {

using qforge::test::q;

// name -> checksum of every tensor: what the file stores, whatever its header says.
std::map<std::string, std::string> tensor_sums(const QfFile& f) {
    std::map<std::string, std::string> out;
    for (const auto& t : f.tensors()) out[t.name] = t.checksum;
    return out;
}

}  // namespace

TEST_CASE("quantize --target-bpw/--target-size: within the target, recorded, reproducible",
          "[quant][size_plan][cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    namespace fs = std::filesystem;
    test::ScratchDir dir("size-plan-cli");
    const fs::path in = test::convert_stories(data, "hf", dir);
    const fs::path text = dir / "calib.txt";
    test::write_file(text, test::tinystories_head(data));
    const std::string calib = " --method rtn --calib " + q(text) + " --nsamples 4 --seqlen 64 ";
    uint64_t params = 0;
    const QfFile src(in.string());
    for (const auto& t : src.tensors()) params += *checked_product(t.shape);

    const fs::path a = dir / "a.qf", b = dir / "b.qf", c = dir / "c.qf";
    auto r = test::run_qforge("quantize " + q(in) + " -o " + q(a) + " --qtype q4" + calib +
                              "--target-bpw 8 --plan-tokens 64 -t 2 --json");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const uint64_t target = static_cast<uint64_t>(8.0 * double(params) / 8.0);
    REQUIRE(fs::file_size(a) <= target);
    const QfFile fa(a.string());
    const nlohmann::json& quant = fa.header()["provenance"]["quantization"];
    const nlohmann::json& plan = quant["size_plan"];
    REQUIRE(plan["target_bytes"] == target);
    REQUIRE(plan["target_bpw"] == 8.0);
    REQUIRE(plan["windows"] == 1);
    // Every planned tensor became an override naming it, with the type the file stores; the
    // mix holds more than one type (the target lies between the all-q4k and all-q8 files).
    std::set<std::string> chosen;
    uint64_t planned = 0;
    for (const auto& t : plan["tensors"]) {
        const QfTensorInfo& info = fa.at(t["name"].get<std::string>());
        REQUIRE(qtype_traits(info.qtype).name == t["qtype"].get<std::string>());
        REQUIRE(t["kld"].size() == 3);
        chosen.insert(t["qtype"].get<std::string>());
        planned += t["bytes"].get<uint64_t>();
    }
    REQUIRE(chosen.size() >= 2);
    REQUIRE(planned == plan["planned_bytes"]);
    REQUIRE(planned <= plan["budget_bytes"].get<uint64_t>());
    REQUIRE(quant["overrides"].size() == plan["tensors"].size());

    // Any thread count: the same file. The recorded overrides alone: the same tensors.
    r = test::run_qforge("quantize " + q(in) + " -o " + q(b) + " --qtype q4" + calib +
                         "--target-bpw 8 --plan-tokens 64 -t 1");
    REQUIRE(r.exit_code == 0);
    REQUIRE(test::read_file(a) == test::read_file(b));
    std::string overrides;
    for (const auto& o : quant["overrides"])
        overrides += " --tensor-type '" + o.get<std::string>() + "'";
    r = test::run_qforge("quantize " + q(in) + " -o " + q(c) + " --qtype q4" + calib + overrides);
    REQUIRE(r.exit_code == 0);
    REQUIRE(tensor_sums(QfFile(c.string())) == tensor_sums(fa));

    // --target-size in MB; a target below what the fixed tensors take; no text; a checkpoint.
    const uint64_t size = fs::file_size(a) - 4000;
    r = test::run_qforge("quantize " + q(in) + " -o " + q(c) + " --qtype q4" + calib +
                         "--target-size " + std::to_string(double(size) / 1e6) +
                         "M --plan-tokens 64");
    REQUIRE(r.exit_code == 0);
    REQUIRE(fs::file_size(c) <= size);
    r = test::run_qforge("quantize " + q(in) + " -o " + q(c) + " --qtype q4" + calib +
                         "--target-size 40KiB");
    REQUIRE(r.exit_code == 1);
    REQUIRE_THAT(r.output, Catch::Contains("--target-size") && Catch::Contains("MB"));
    r = test::run_qforge("quantize " + q(in) + " -o " + q(c) + " --qtype q4 --target-bpw 5");
    REQUIRE(r.exit_code == 2);
    REQUIRE_THAT(r.output, Catch::Contains("--calib"));
    r = test::run_qforge("quantize " + q(in) + " -o " + q(c) + " --qtype q4" + calib +
                         "--target-size 12x");
    REQUIRE(r.exit_code == 2);
    r = test::run_qforge("quantize " + q(data / "stories260K" / "hf") + " --tokenizer " +
                         q(data / "stories260K" / "tok512.bin") + " -o " + q(c) + " --qtype q4" +
                         calib + "--target-bpw 6");
    REQUIRE(r.exit_code == 1);
    REQUIRE_THAT(r.output, Catch::Contains("convert"));
}

}  // namespace quant_size_plan_test
