#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/progress.hpp"
#include "runtime/backend.hpp"
#include "runtime/model.hpp"
#include "runtime/perplexity.hpp"
#include "runtime/thread_pool.hpp"
#include "tokenizer/tokenizer.hpp"

namespace qforge::cli {

namespace {

std::string read_text(const std::string& path) {
    std::string text = read_text_file(path);
    if (text.empty()) throw Error(path, {}, "the file is empty: perplexity needs text to score");
    return text;
}

}  // namespace

Runner register_ppl(CLI::App& app, CommonOptions& common) {
    struct Args {
        std::string model, protocol = "llamacpp", kl_base;
        uint64_t ctx = 512, chunks = 0;
    };
    auto a = std::make_shared<Args>();
    add_model_input(app, "model", a->model)->required();
    add_file_option(app, common, true);
    // 2 is the smallest window that scores a token (gptq scores positions 1 .. ctx - 1). Whether a
    // given ctx scores anything under the chosen protocol and text is checked once the text is
    // tokenized (plan_perplexity names the text, the protocol and the ctx range that would). The
    // model's max_position_embeddings is the real upper bound, checked once the model is open.
    add_int_option(app, "--ctx", a->ctx, 2, uint64_t{1} << 24, "tokens per chunk (window)");
    std::vector<std::string> protocols;
    for (const PplProtocol p : {PplProtocol::llamacpp, PplProtocol::gptq})
        protocols.emplace_back(ppl_protocol_name(p));
    add_choice_option(
        app, "--protocol", a->protocol, protocols,
        "llamacpp: chunks start with BOS, the second half of each is scored (llama-perplexity); "
        "gptq: non-overlapping windows, all but the first token scored");
    add_int_option(app, "--chunks", a->chunks, 0, std::numeric_limits<uint32_t>::max(),
                   "evaluate only the first N chunks (0: all)");
    add_model_input(app, "--kl-base", a->kl_base,
                    "base model (e.g. the FP16 .qf, or any input kind): also report KL divergence "
                    "from it, top-1 agreement "
                    "and RMS of the probability difference, both run in the same pass (the "
                    "base always with exact bf16 activations)");
    add_threads_option(app, common);
    add_cpu_backend_options(app, common);
    add_backend_option(app, common);
    add_json_option(app, common);

    return [a, &common]() {
        const PplProtocol protocol = *ppl_protocol_from_name(a->protocol);
        const auto model_file = open_qf_input(a->model);
        Model model(model_file->path());
        const Tokenizer tok = Tokenizer::from_schema(model.file().tokenizer(), a->model);
        const uint64_t max_pos = model.config().max_position_embeddings;
        if (a->ctx > max_pos)
            throw Error(a->model, {},
                        "--ctx " + std::to_string(a->ctx) +
                            " exceeds the model's max_position_embeddings (" +
                            std::to_string(max_pos) + "); positions beyond it were never trained");
        std::optional<Model> base;
        std::unique_ptr<QfInput> base_file;
        if (!a->kl_base.empty()) {
            base_file = open_qf_input(a->kl_base);
            base.emplace(base_file->path());
        }
        if (base && a->ctx > base->config().max_position_embeddings)
            throw Error(a->kl_base, {},
                        "--ctx " + std::to_string(a->ctx) +
                            " exceeds the base model's max_position_embeddings (" +
                            std::to_string(base->config().max_position_embeddings) + ")");

        const std::string text = read_text(common.file);
        const std::vector<int32_t> tokens = tok.encode(text, true);
        const PplPlan plan = [&] {
            try {
                return plan_perplexity(protocol, tokens.size(), a->ctx, a->chunks, tok.add_bos(),
                                       tok.bos_id());
            } catch (const Error& e) {
                throw e.with_file(common.file);  // the plan is about this text
            }
        }();

        ThreadPool pool(resolved_threads(common));
        auto backend = make_selected_backend(common, model, pool);
        // The base is the reference: its bf16 products keep exact activations and its KV cache
        // f32, so `--bf16-activations --kl-base` or `--kv-type f16 --kl-base` on the same file
        // measures what the mode costs.
        CommonOptions base_options = common;
        base_options.bf16_activations = false;
        base_options.kv_type = "f32";
        std::unique_ptr<Backend> base_backend =
            base ? make_selected_backend(base_options, *base, pool) : nullptr;

        const bool chatty = !common.quiet;
        if (chatty)
            std::fprintf(stderr,
                         "ppl: %zu tokens; %llu chunks of %llu (%s), scoring %llu tokens per "
                         "chunk; %d threads\n",
                         tokens.size(), static_cast<unsigned long long>(plan.n_chunks),
                         static_cast<unsigned long long>(plan.ctx), a->protocol.c_str(),
                         static_cast<unsigned long long>(plan.scored_per_chunk()), pool.size());
        PplResult r;
        {
            Progress progress("ppl", plan.n_chunks * plan.ctx, Progress::Unit::tokens);
            // A running value about ten times per run, on lines of their own.
            const uint64_t every = std::max<uint64_t>(1, plan.n_chunks / 10);
            const char* clear_line = ::isatty(STDERR_FILENO) ? "\r\x1b[K" : "";
            r = run_perplexity(
                *backend, base_backend.get(), tokens, plan,
                [&](uint64_t done, const NllStats& nll) {
                    progress.update(done * plan.ctx);
                    if (chatty && !common.json && (done % every == 0 || done == plan.n_chunks))
                        std::fprintf(stderr, "%s[%llu/%llu] PPL = %.4f +/- %.5f\n", clear_line,
                                     static_cast<unsigned long long>(done),
                                     static_cast<unsigned long long>(plan.n_chunks), nll.ppl(),
                                     nll.ppl_stderr());
                });
        }
        const double tok_per_s =
            r.seconds > 0 ? static_cast<double>(r.tokens_evaluated) / r.seconds : 0.0;
        if (common.json) {
            nlohmann::json j = {{"ppl", r.nll.ppl()},
                                {"ppl_stderr", r.nll.ppl_stderr()},
                                {"n_tokens_scored", r.nll.count},
                                {"n_chunks", r.n_chunks},
                                {"ctx", plan.ctx},
                                {"protocol", a->protocol},
                                {"n_tokens", tokens.size()},
                                {"seconds", r.seconds},
                                {"tokens_per_second", tok_per_s},
                                {"fp16_saturations", backend->fp16_saturations()}};
            if (base_backend) j["base_fp16_saturations"] = base_backend->fp16_saturations();
            if (r.kl) {
                j["kld"] = r.kl->mean_kl();
                j["kld_stderr"] = r.kl->kl_stderr();
                j["top1_agreement"] = r.kl->top1_agreement();
                j["rms_dp"] = r.kl->rms_dp();
                j["base_ppl"] = r.base_nll->ppl();
                j["base_ppl_stderr"] = r.base_nll->ppl_stderr();
            }
            std::printf("%s\n", j.dump(2).c_str());
        } else {
            std::printf("PPL = %.4f +/- %.5f\n", r.nll.ppl(), r.nll.ppl_stderr());
            if (r.base_nll)
                std::printf("base PPL = %.4f +/- %.5f (%s, the same tokens)\n", r.base_nll->ppl(),
                            r.base_nll->ppl_stderr(), a->kl_base.c_str());
            if (r.kl)
                std::printf("KLD = %.6f +/- %.6f; top-1 agreement = %.3f%%; RMS dp = %.3f%%\n",
                            r.kl->mean_kl(), r.kl->kl_stderr(), 100.0 * r.kl->top1_agreement(),
                            100.0 * r.kl->rms_dp());
            std::printf("%llu tokens scored in %llu chunks of %llu (%s); %.1f tokens/s%s\n",
                        static_cast<unsigned long long>(r.nll.count),
                        static_cast<unsigned long long>(r.n_chunks),
                        static_cast<unsigned long long>(plan.ctx), a->protocol.c_str(), tok_per_s,
                        base ? " per model" : "");
            print_fp16_saturations(*backend);
            if (base_backend) print_fp16_saturations(*base_backend);
        }
        return 0;
    };
}

}  // namespace qforge::cli
