#include <charconv>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "commands.hpp"
#include "core/error.hpp"
#include "formats/json_io.hpp"
#include "runtime/backend.hpp"
#include "runtime/generate.hpp"
#include "runtime/json_grammar.hpp"
#include "runtime/model.hpp"
#include "runtime/regex_dfa.hpp"
#include "runtime/sampling.hpp"
#include "runtime/thread_pool.hpp"
#include "runtime/token_constraint.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/tokenizer.hpp"

namespace qforge::cli {

namespace {
// `--repeat-last-n N` (llama.cpp's): the window SamplingParams::repetition_last_n takes (0: the
// whole context, for -1), or none for 0 (the penalty off).
std::optional<uint64_t> repeat_window(const std::string& text) {
    if (text == "-1") return uint64_t{0};
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
        n > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
        throw Error("--repeat-last-n '" + text +
                    "': expected -1 (the whole context) or an integer from 0 to 2147483647");
    if (n == 0) return std::nullopt;
    return n;
}

// `--json-schema SCHEMA`'s grammar; an Error naming the option for bad JSON or a schema outside
// the subset.
JsonGrammar json_schema_grammar(const std::string& text) {
    return JsonGrammar::from_schema(parse_ordered_json(text, "--json-schema"), "--json-schema");
}

// The constraint one of --json-schema, --regex and --choice gives (CLI11 lets one through), or
// none.
std::optional<TextGrammar> text_grammar(const std::string& schema, const std::string& regex,
                                        const std::vector<std::string>& choices) {
    if (!schema.empty()) return json_schema_grammar(schema);
    if (!regex.empty()) return RegexDfa::compile(regex, "--regex");
    if (!choices.empty()) return RegexDfa::choice(choices, "--choice");
    return std::nullopt;
}
}  // namespace

Runner register_generate(CLI::App& app, CommonOptions& common) {
    struct Args {
        std::string model, prompt, system, chat_template;
        uint64_t n = 128;
        float temp = 0.8f, top_p = 0.95f, min_p = 0.0f, presence_penalty = 0.0f,
              frequency_penalty = 0.0f, repeat_penalty = 1.0f;
        std::string repeat_last_n = "64";
        uint32_t top_k = 40;
        std::vector<std::string> logit_bias;
        std::string json_schema, regex;
        std::vector<std::string> choices;
        bool greedy = false;
        bool raw = false;
        bool ignore_eos = false;
    };
    auto a = std::make_shared<Args>();
    add_model_input(app, "model", a->model)->required();
    app.add_option("-p,--prompt", a->prompt,
                   "the user's message, rendered with the model's chat template when it has one; "
                   "with --raw or no template, text to continue (empty: start from BOS)");
    app.add_option("--system", a->system, "a system message for the chat template");
    app.add_flag("--raw", a->raw, "continue the prompt as plain text, without the chat template");
    add_input_option(app, "--chat-template", a->chat_template,
                     "a Jinja chat template file to use instead of the model's (for a model "
                     "whose files carry none, e.g. scripts/chat_templates/gemma3.jinja)");
    // The model's context is the real bound (generation stops when it is full).
    add_int_option(app, "-n,--tokens", a->n, 1, uint64_t{1} << 24,
                   "new tokens to generate at most");
    add_real_option(app, "--temp", a->temp, {0.0, true}, {100.0, true},
                    "sampling temperature (0: greedy)");
    add_int_option(app, "--top-k", a->top_k, 0, std::numeric_limits<uint32_t>::max(),
                   "sample from the k most likely tokens (0: all)");
    add_real_option(app, "--top-p", a->top_p, {0.0, false}, {1.0, true},
                    "sample from the smallest set of tokens holding this probability (1: all)");
    add_real_option(app, "--min-p", a->min_p, {0.0, true}, {1.0, true},
                    "then drop tokens less likely than this times the most likely one (0: none)");
    add_real_option(app, "--presence-penalty", a->presence_penalty, {-2.0, true}, {2.0, true},
                    "subtracted from the logit of every token already generated (the OpenAI "
                    "API's presence_penalty)");
    add_real_option(app, "--frequency-penalty", a->frequency_penalty, {-2.0, true}, {2.0, true},
                    "subtracted from a token's logit per time it was generated (the OpenAI "
                    "API's frequency_penalty)");
    add_real_option(app, "--repeat-penalty", a->repeat_penalty, {kMinRepetitionPenalty, true},
                    {kMaxRepetitionPenalty, true},
                    "divide a positive logit, multiply a negative one, by this for every token "
                    "among the context's last --repeat-last-n (prompt and output; llama.cpp's "
                    "--repeat-penalty, transformers' and vLLM's repetition_penalty; 1: none)");
    app.add_option("--repeat-last-n", a->repeat_last_n,
                   "the context's last tokens --repeat-penalty looks at (0: none, -1: all of "
                   "them, as transformers and vLLM do)")
        ->capture_default_str()
        ->check(parsed_by([](const std::string& s) { repeat_window(s); }));
    app.add_option("--logit-bias", a->logit_bias,
                   "ID=BIAS: add BIAS (in [-100, 100]) to token ID's logit before each choice "
                   "(the OpenAI API's logit_bias; repeatable)")
        ->check(parsed_by([](const std::string& s) { parse_logit_bias(s); }));
    app.add_option("-j,--json-schema", a->json_schema,
                   "SCHEMA: generate a JSON document of this JSON schema (llama.cpp's option; "
                   "'{\"type\": \"object\"}': any object, '{}': any JSON value); the subset "
                   "and its bounds: runtime/json_grammar.hpp")
        ->check(parsed_by([](const std::string& s) { json_schema_grammar(s); }));
    auto* regex =
        app.add_option("--regex", a->regex,
                       "PATTERN: generate a whole match of this regular expression (Python's "
                       "syntax and re.fullmatch's matches with re.ASCII, vLLM's guided_regex; "
                       "what is refused: runtime/regex_dfa.hpp)")
            ->check(parsed_by([](const std::string& s) { RegexDfa::compile(s, "--regex"); }))
            ->excludes("--json-schema");
    app.add_option("--choice", a->choices,
                   "TEXT: generate exactly one of the texts (repeatable; vLLM's guided_choice)")
        ->excludes("--json-schema")
        ->excludes(regex);
    app.add_flag("--greedy", a->greedy, "always take the most likely token (same as --temp 0)");
    app.add_flag("--ignore-eos", a->ignore_eos,
                 "go on past end-of-sequence tokens (printed as their text) until -n tokens or a "
                 "full context: a fixed length, for benchmarks (llama.cpp's --ignore-eos)");
    add_seed_option(app, common);
    add_threads_option(app, common);
    add_cpu_backend_options(app, common);
    add_backend_option(app, common);

    return [a, &common]() {
        const auto model_file = open_qf_input(a->model);
        Model model(model_file->path());
        const Tokenizer tok = Tokenizer::from_schema(model.file().tokenizer(), a->model);
        // A chat model answers its template's rendering of the prompt; the template writes the
        // special tokens itself, so the rendered text is encoded without adding BOS/EOS.
        std::vector<int32_t> prompt;
        const std::string chat_template =
            a->chat_template.empty() ? "" : read_text_file(a->chat_template);
        bool chat = !a->raw && !a->prompt.empty() &&
                    !(chat_template.empty() && tok.chat_template().empty());
        if (chat) {
            try {
                prompt =
                    tok.encode(render_chat_prompt(tok, a->system, a->prompt, chat_template), false);
            } catch (const Error& e) {
                std::fprintf(stderr, "qforge: warning: %s; continuing the raw prompt (--raw)\n",
                             e.what());
                chat = false;
            }
        }
        if (!chat && a->prompt.empty()) {
            if (!tok.bos_id())
                throw Error(a->model, {},
                            "an empty prompt starts from BOS, but the tokenizer has none");
            prompt = {*tok.bos_id()};
        } else if (!chat) {
            prompt = tok.encode(a->prompt, true);
        }
        const uint64_t max_pos = model.config().max_position_embeddings;
        if (prompt.size() > max_pos)
            throw Error(a->model, {},
                        "the prompt has " + std::to_string(prompt.size()) +
                            " tokens; the model's context holds " + std::to_string(max_pos));
        if (prompt.size() + a->n > max_pos)
            std::fprintf(
                stderr,
                "qforge: warning: %zu prompt + %llu new tokens exceed the context of %llu; "
                "generation stops when it is full\n",
                prompt.size(), static_cast<unsigned long long>(a->n),
                static_cast<unsigned long long>(max_pos));

        GenerateOptions o;
        o.sampling = {
            a->greedy ? 0.0f : a->temp, a->top_k, a->top_p, common.seed, a->presence_penalty,
            a->frequency_penalty};
        o.sampling.min_p = a->min_p;
        if (const std::optional<uint64_t> window = repeat_window(a->repeat_last_n)) {
            o.sampling.repetition_penalty = a->repeat_penalty;
            o.sampling.repetition_last_n = *window;
        }
        for (const std::string& b : a->logit_bias) {
            o.sampling.logit_bias.push_back(parse_logit_bias(b));
            if (static_cast<uint64_t>(o.sampling.logit_bias.back().first) >= tok.vocab_size())
                throw Error(a->model, {},
                            "--logit-bias '" + b + "': token " +
                                std::to_string(o.sampling.logit_bias.back().first) +
                                " is outside the vocabulary (" + std::to_string(tok.vocab_size()) +
                                ")");
        }
        o.max_new_tokens = a->n;
        o.stop_ids = chat_template.empty() ? tok.stop_ids() : chat_stop_ids(tok, chat_template);
        if (a->ignore_eos) o.stop_ids.clear();
        if (auto g = text_grammar(a->json_schema, a->regex, a->choices)) {
            if (a->ignore_eos)
                throw UsageError(
                    "--json-schema, --regex, --choice: the text ends with a stop token, which "
                    "--ignore-eos takes away");
            o.sampling.grammar = std::make_shared<const TokenGrammar>(
                TokenGrammar{std::move(*g), std::make_shared<const TokenTexts>(tok), o.stop_ids});
        }
        o.token_count = tok.vocab_size();  // padding rows past the tokenizer are never sampled

        ThreadPool pool(resolved_threads(common));
        auto backend = make_selected_backend(common, model, pool);
        if (!chat) std::fputs(a->prompt.c_str(), stdout);  // a chat shows only the reply
        int32_t previous = prompt.back();
        const GenerateResult r = generate(*backend, prompt, o, [&](int32_t id) {
            const std::string piece = tok.decode_piece(previous, id);
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
            previous = id;
        });
        std::fputc('\n', stdout);
        std::fflush(stdout);

        if (common.quiet) return 0;
        const char* why = r.stop == GenerateResult::Stop::stop_id        ? "stop token"
                          : r.stop == GenerateResult::Stop::context_full ? "context full"
                          : r.stop == GenerateResult::Stop::document ? "constrained text complete"
                                                                     : "token limit";
        std::fprintf(
            stderr,
            "prompt: %zu tokens, %.1f tok/s; generated: %zu tokens, %.1f tok/s (%s); %d threads\n",
            prompt.size(),
            r.prompt_seconds > 0 ? static_cast<double>(prompt.size()) / r.prompt_seconds : 0.0,
            r.tokens.size(),
            r.decode_seconds > 0 ? static_cast<double>(r.decode_steps) / r.decode_seconds : 0.0,
            why, pool.size());
        return 0;
    };
}

}  // namespace qforge::cli
