// qforge tokenize SOURCE (-p TEXT | -f FILE) [--ids] [--count] [--json]: parse, encode, print.
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace qforge::cli {

Runner register_tokenize(CLI::App& app, CommonOptions& common) {
    struct Args {
        std::string source, prompt;
        bool ids = false, count = false, no_special = false;
    };
    auto a = std::make_shared<Args>();
    add_input_option(app, "source", a->source,
                     "a .qf, a tokenizer.json, a GGUF model (its tokenizer.ggml.* metadata) or a "
                     "llama2.c vocabulary (.bin)")
        ->required();
    auto* prompt = app.add_option("-p,--prompt", a->prompt, "text to tokenize");
    add_file_option(app, common, false);
    prompt->excludes("--file");
    app.add_flag("--ids", a->ids, "print only the ids, space-separated");
    app.add_flag("--count", a->count, "print only the number of tokens");
    app.add_flag("--no-special", a->no_special, "do not add BOS/EOS");
    add_json_option(app, common);

    return [a, prompt, &common]() {
        if (common.file.empty() && prompt->count() == 0)
            throw UsageError(
                "qforge tokenize: missing the text: -p/--prompt TEXT or -f/--file FILE");
        const Tokenizer tok = Tokenizer::load(a->source);
        const std::string text = common.file.empty() ? a->prompt : read_text_file(common.file);
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<int32_t> ids = tok.encode(text, !a->no_special);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double mb_per_s =
            seconds > 0 ? static_cast<double>(text.size()) / 1e6 / seconds : 0.0;
        if (common.json) {
            nlohmann::json j = {{"count", ids.size()},
                                {"bytes", text.size()},
                                {"seconds", seconds},
                                {"mb_per_s", mb_per_s}};
            if (!a->count) j["ids"] = ids;
            if (!a->count && !a->ids) {
                nlohmann::json pieces = nlohmann::json::array();
                for (int32_t id : ids) pieces.push_back(std::string(tok.piece(id)));
                j["pieces"] = pieces;
            }
            std::printf("%s\n",
                        j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
            return 0;
        }
        if (a->count) {
            std::printf("%zu\n", ids.size());
        } else if (a->ids) {
            for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
            std::printf("\n");
        } else {
            for (int32_t id : ids) {
                // The vocabulary piece as JSON, so spaces, control bytes and ▁ stay visible.
                const std::string shown =
                    nlohmann::json(std::string(tok.piece(id)))
                        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
                std::printf("%8d  %s\n", id, shown.c_str());
            }
        }
        if (!common.file.empty())
            std::fprintf(stderr, "qforge: %zu tokens from %zu bytes in %.3f s (%.1f MB/s)\n",
                         ids.size(), text.size(), seconds, mb_per_s);
        return 0;
    };
}

}  // namespace qforge::cli
