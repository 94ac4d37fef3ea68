#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "commands.hpp"
#include "core/progress.hpp"
#include "kernels/cpu/isa.hpp"
#include "runtime/backend.hpp"
#include "runtime/bench.hpp"
#include "runtime/model.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge::cli {

namespace {

nlohmann::json rate_json(const RateStats& s) {
    return {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"runs", s.runs}};
}

}  // namespace

Runner register_bench(CLI::App& app, CommonOptions& common) {
    struct Args {
        std::string model;
        BenchOptions bench;
        double bandwidth = 0.0;  // 0: not given
    };
    auto a = std::make_shared<Args>();
    // The model's context is the real bound (run_bench checks it); this one refuses nonsense
    // before the model is read.
    const uint64_t kMaxTokens = uint64_t{1} << 24;
    add_model_input(app, "model", a->model)->required();
    add_int_option(app, "-p,--prompt,--prefill", a->bench.prefill_tokens, 1, kMaxTokens,
                   "tokens in the prefill batch");
    add_int_option(app, "-n,--gen,--decode", a->bench.decode_tokens, 1, kMaxTokens,
                   "tokens decoded one at a time");
    add_int_option(app, "-b,--batch", a->bench.decode_batch, 1, 4096,
                   "sequences decoded together, each with its own cache: every decode step is "
                   "one batched step of one token from each (as `serve` runs them); tok/s counts "
                   "all of them");
    add_int_option(app, "-c,--context", a->bench.decode_context, 1, kMaxTokens,
                   "positions in each decode cache before the timed steps (default " +
                       std::to_string(kBenchDecodeContext) +
                       "): the context attention reads, as a served prompt plus its output");
    add_int_option(app, "-r,--reps", a->bench.repetitions, 1, 1000,
                   "repetitions; medians are reported");
    add_real_option(app, "--bandwidth", a->bandwidth, {0.0, false}, {1e6, true},
                    "read bandwidth in GB/s to quote decode against (default: measured here, "
                    "with the same threads, just before the timed passes)")
        ->default_str("");
    add_seed_option(app, common);
    add_threads_option(app, common);
    add_cpu_backend_options(app, common);
    add_backend_option(app, common);
    add_json_option(app, common);

    return [a, &common]() {
        BenchOptions o = a->bench;
        o.seed = common.seed;
        const auto model_file = open_qf_input(a->model);
        Model model(model_file->path());
        ThreadPool pool(resolved_threads(common));
        if (a->bandwidth > 0.0)
            o.bandwidth_gb_per_s = a->bandwidth;
        else  // beside each repetition's decode (BenchOptions::measure_bandwidth)
            o.measure_bandwidth = [&pool] { return measure_read_bandwidth(pool); };
        auto backend = make_selected_backend(common, model, pool);
        BenchResult r;
        {
            Progress progress("bench", bench_total_tokens(o), Progress::Unit::tokens);
            r = run_bench(*backend, o, [&](uint64_t done) { progress.update(done); });
        }

        const ModelConfig& c = model.config();
        const bool measured = !o.bandwidth_gb_per_s;
        const double bandwidth = measured ? r.bandwidth.median : *o.bandwidth_gb_per_s;
        if (common.json) {
            nlohmann::json j = {
                {"model", a->model},
                {"threads", pool.size()},
                {"prefill_tokens", o.prefill_tokens},
                {"decode_tokens", o.decode_tokens},
                {"decode_context", o.decode_context ? o.decode_context : kBenchDecodeContext},
                {"decode_batch", o.decode_batch},
                {"repetitions", o.repetitions},
                {"seed", o.seed},
                {"prefill_tok_s", r.prefill.median},
                {"decode_tok_s", r.decode.median},
                {"prefill_tok_per_s", rate_json(r.prefill)},
                {"decode_tok_per_s", rate_json(r.decode)},
                {"weight_bytes_per_token", r.weight_bytes_per_token},
                {"effective_gb_per_s", r.effective_gb_per_s},
                {"read_bandwidth_gb_s", bandwidth},
                {"read_bandwidth_measured", measured},
                {"bandwidth_fraction", *r.bandwidth_fraction},
                {"int8_activations", !common.float_activations},
                {"bf16_activations", common.bf16_activations},
                {"kv_type", common.kv_type},
                {"cpu_isa", std::string(isa_name(cpu_isa()))},
                {"fp16_saturations", backend->fp16_saturations()}};
            if (measured) j["read_bandwidth_gb_per_s"] = rate_json(r.bandwidth);
            std::printf("%s\n", j.dump(2).c_str());
            return 0;
        }
        std::printf("%s: %llu layers, hidden %llu, vocab %llu; %d thread%s; median of %d\n",
                    a->model.c_str(), static_cast<unsigned long long>(c.num_layers),
                    static_cast<unsigned long long>(c.hidden_size),
                    static_cast<unsigned long long>(c.vocab_size), pool.size(),
                    pool.size() == 1 ? "" : "s", o.repetitions);
        std::printf("%-8s %7s %12s %12s %12s\n", "phase", "tokens", "tok/s", "min", "max");
        const auto row = [](const char* phase, uint64_t tokens, const RateStats& s) {
            std::printf("%-8s %7llu %12.2f %12.2f %12.2f\n", phase,
                        static_cast<unsigned long long>(tokens), s.median, s.min, s.max);
        };
        row("prefill", o.prefill_tokens, r.prefill);
        row("decode", o.decode_tokens * o.decode_batch, r.decode);
        if (o.decode_batch > 1)
            std::printf("decode: %llu sequences, one batched step per token of each\n",
                        static_cast<unsigned long long>(o.decode_batch));
        std::printf("decode reads %s of weights per token: %.2f GB/s effective",
                    human_bytes(r.weight_bytes_per_token).c_str(), r.effective_gb_per_s);
        if (r.bandwidth_fraction)
            std::printf(", %.1f%% of %.1f GB/s read bandwidth%s", 100.0 * *r.bandwidth_fraction,
                        bandwidth, measured ? " (measured beside each repetition; medians)" : "");
        std::printf("\n");
        print_fp16_saturations(*backend);
        return 0;
    };
}

}  // namespace qforge::cli
