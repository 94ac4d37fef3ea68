// qforge: one binary, one subcommand per job. Every error leaves here as one line on stderr,
// "qforge: error: ...": a usage error (CLI11's parse errors, cli::UsageError) with exit code 2, a
// failure of the work (qforge::Error from any layer) with exit code 1 (README.md, "Errors and
// exit codes").
#include <cstdio>
#include <map>
#include <new>
#include <string>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/progress.hpp"
#include "formats/json_io.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/device_info.hpp"

namespace {

std::string version_text() {
    std::string s = "qforge " QFORGE_VERSION;
    if (qforge::built_with_cuda()) {
        std::string why;
        auto gpus = qforge::list_gpus(&why);
        s += " (CUDA " + qforge::cuda_build_version() + "; " + std::to_string(gpus.size()) +
             " GPU" + (gpus.size() == 1 ? "" : "s") + (gpus.empty() ? ": " + why : "") + ")";
    } else {
        s += " (built without CUDA)";
    }
    s += "\nCPU kernels: " + qforge::cpu_isa_description();
    return s;
}

// The message as one line: a file name or value holding a newline must not start a second one.
int fail(int code, std::string_view message) {
    std::string line = "qforge: error: ";
    for (const char c : message) {
        if (c == '\n')
            line += "\\n";
        else if (c == '\r')
            line += "\\r";
        else
            line += c;
    }
    std::fprintf(stderr, "%s\n", line.c_str());
    return code;
}

}  // namespace

// CLI11 runs the validators before it looks at --help, so `qforge ppl --ctx 1 --help` would be
// a usage error. When -h/--help is on the line (before "--"), the user asked for help: the help
// of the subcommand named (or the top level's) is printed, as for any other --help.
bool print_help_if_asked(const CLI::App& app, int argc, char** argv) {
    const CLI::App* shown = &app;
    bool asked = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--") break;
        if (arg == "-h" || arg == "--help") asked = true;
        if (shown == &app)
            for (const CLI::App* sub : app.get_subcommands({}))
                if (sub->get_name() == arg) shown = sub;
    }
    if (asked) std::fputs((shown == &app ? app.help() : shown->help(argv[0])).c_str(), stdout);
    return asked;
}

int main(int argc, char** argv) {
    CLI::App app{"qforge: convert, quantize, run and evaluate LLMs in the packed .qf format"};
    app.require_subcommand(1);
    app.fallthrough();  // top-level flags (--quiet) also work after the subcommand
    app.set_version_flag("--version", version_text);
    // A flag takes no value: "--greedy=2" or "--json=false" is a usage error, not a silent true.
    // Set before the subcommands are added, which copy the defaults.
    app.option_defaults()->disable_flag_override();
    qforge::cli::CommonOptions common;
    app.add_flag("-q,--quiet", common.quiet, "no progress bars on stderr");

    std::map<CLI::App*, qforge::cli::Runner> runners;
    auto add = [&](const char* name, const char* help, auto reg) {
        CLI::App* sub = app.add_subcommand(name, help);
        runners[sub] = reg(*sub, common);
    };
    add("convert",
        "convert a Hugging Face checkpoint (directory or .safetensors), a GGUF or a llama2.c "
        "checkpoint to .qf",
        qforge::cli::register_convert);
    add("quantize",
        "quantize a .qf or Hugging Face checkpoint to a .qf (rtn; per-tensor types by regex)",
        qforge::cli::register_quantize);
    add("inspect",
        "show the config, tensors, dtypes and sizes of a .qf, .safetensors or HF directory",
        qforge::cli::register_inspect);
    add("verify", "check a .qf file's structure and every tensor checksum",
        qforge::cli::register_verify);
    add("tokenize",
        "text to token ids with the tokenizer of a .qf, tokenizer.json, GGUF or llama2.c .bin",
        qforge::cli::register_tokenize);
    add("ppl",
        "perplexity of a .qf on a text file (llama.cpp or GPTQ protocol), optionally KL divergence "
        "from a base model",
        qforge::cli::register_ppl);
    add("generate", "generate text from a prompt with a .qf (greedy or sampled)",
        qforge::cli::register_generate);
    add("bench", "prefill and decode tokens/s of a .qf, and decode's fraction of read bandwidth",
        qforge::cli::register_bench);
    add("export", "write a quantized .qf as a Hugging Face GPTQ or AWQ checkpoint directory",
        qforge::cli::register_export);
    add("serve",
        "serve a .qf over an OpenAI-compatible HTTP API (continuous batching, paged KV cache)",
        qforge::cli::register_serve);

    using qforge::cli::kExitFailure;
    using qforge::cli::kExitUsage;
    try {
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {
        return app.exit(e);  // --help, --version: printed on stdout, exit 0
    } catch (const CLI::ParseError& e) {
        return fail(kExitUsage, qforge::cli::usage_error_message(app, e));
    } catch (const qforge::cli::UsageError& e) {
        if (print_help_if_asked(app, argc, argv)) return 0;
        return fail(kExitUsage, e.what());
    }
    if (common.quiet) qforge::Progress::set_enabled(false);
    try {
        for (auto* sub : app.get_subcommands()) return runners.at(sub)();
    } catch (const qforge::cli::UsageError& e) {
        return fail(kExitUsage, e.what());
    } catch (const qforge::Error& e) {
        return fail(kExitFailure, e.what());
    } catch (const nlohmann::json::exception& e) {
        // Readers name the file through with_json_errors; this is the last backstop, so at least
        // nlohmann's "[json.exception...]" prefix never reaches the user.
        return fail(kExitFailure, qforge::json_exception_text(e));
    } catch (const std::bad_alloc&) {
        return fail(kExitFailure, "out of memory");
    } catch (const std::exception& e) {
        return fail(kExitFailure, e.what());
    }
    return kExitFailure;
}
