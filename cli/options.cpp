#include "options.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>

#include "core/error.hpp"
#include "runtime/model.hpp"

namespace qforge::cli {

namespace {

// A value as messages show it: in quotes, control bytes escaped, so a message stays one line.
std::string shown(std::string_view s) {
    std::string out = "'";
    for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", u);
            out += buf;
        } else {
            out += c;
        }
    }
    return out + "'";
}

std::string bound_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// An option as the user would type it: "-f/--file", "--ctx"; a positional by its name.
std::string option_display(const CLI::Option& opt) {
    std::vector<std::string> names;
    for (const auto& s : opt.get_snames()) names.push_back("-" + s);
    for (const auto& l : opt.get_lnames()) names.push_back("--" + l);
    if (names.empty()) return opt.get_name(true);
    if (names.size() > 2) names.resize(2);
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : "/") + n;
    return s;
}

std::string subcommand_names(const CLI::App& app) {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
        names.push_back(sub->get_name());
    return join_names(names);
}

}  // namespace

std::string join_names(const std::vector<std::string>& names) {
    std::string s;
    for (const auto& x : names) s += (s.empty() ? "" : ", ") + x;
    return s;
}

std::string option_label(const std::string& names) {
    std::string short_name, long_name, positional;
    size_t start = 0;
    while (start <= names.size()) {
        const size_t comma = std::min(names.find(',', start), names.size());
        const std::string n = names.substr(start, comma - start);
        if (n.rfind("--", 0) == 0) {
            if (long_name.empty()) long_name = n;
        } else if (n.rfind('-', 0) == 0) {
            if (short_name.empty()) short_name = n;
        } else if (positional.empty()) {
            positional = n;
        }
        start = comma + 1;
    }
    if (!short_name.empty() && !long_name.empty()) return short_name + "/" + long_name;
    if (!long_name.empty()) return long_name;
    return short_name.empty() ? positional : short_name;
}

CLI::Validator integer_range(const std::string& label, uint64_t min, uint64_t max) {
    const std::string expected =
        "expected an integer from " + std::to_string(min) + " to " + std::to_string(max);
    return CLI::Validator(
        [label, min, max, expected](std::string& s) -> std::string {
            const bool negative = !s.empty() && s[0] == '-';
            const std::string_view digits = std::string_view(s).substr(negative ? 1 : 0);
            if (digits.empty() || !std::all_of(digits.begin(), digits.end(),
                                               [](char c) { return c >= '0' && c <= '9'; }))
                throw UsageError(label + ": " + shown(s) + " is not an integer; " + expected);
            uint64_t v = 0;
            const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
            (void)end;
            // "-0" is 0; any other negative value is out of range for these counts.
            if (ec != std::errc() || (negative && v != 0) || v < min || v > max)
                throw UsageError(label + ": " + s + " is out of range; " + expected);
            s = std::to_string(v);
            return {};
        },
        "[" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

CLI::Validator real_range(const std::string& label, RealBound lo, RealBound hi, bool as_float) {
    const std::string interval = std::string(lo.inclusive ? "[" : "(") + bound_text(lo.value) +
                                 ", " + bound_text(hi.value) + (hi.inclusive ? "]" : ")");
    const std::string expected = "expected a number in " + interval;
    return CLI::Validator(
        [label, lo, hi, as_float, expected](std::string& s) -> std::string {
            const bool space = !s.empty() && (std::isspace(static_cast<unsigned char>(s[0])) != 0);
            char* end = nullptr;
            errno = 0;
            const double parsed = s.empty() || space ? 0.0 : std::strtod(s.c_str(), &end);
            // "nan" and "inf" are not numbers here; 1e400 is one, out of range (ERANGE).
            const bool overflow = errno == ERANGE;
            if (s.empty() || space || end != s.c_str() + s.size() ||
                (!std::isfinite(parsed) && !overflow))
                throw UsageError(label + ": " + shown(s) + " is not a number; " + expected);
            // The value as stored: a float option's rounding must itself be in range.
            const double v = as_float ? static_cast<double>(static_cast<float>(parsed)) : parsed;
            const bool above_lo = lo.inclusive ? v >= lo.value : v > lo.value;
            const bool below_hi = hi.inclusive ? v <= hi.value : v < hi.value;
            if (!std::isfinite(v) || !above_lo || !below_hi)
                throw UsageError(label + ": " + s + " is out of range; " + expected);
            char buf[40];
            std::snprintf(buf, sizeof buf, "%.17g", v);
            s = buf;
            return {};
        },
        interval);
}

CLI::Validator one_of(const std::string& label, std::vector<std::string> choices) {
    const std::string list = join_names(choices);
    return CLI::Validator(
        [label, choices = std::move(choices), list](std::string& s) -> std::string {
            if (std::find(choices.begin(), choices.end(), s) == choices.end())
                throw UsageError(label + ": " + shown(s) +
                                 " is not valid; expected one of: " + list);
            return {};
        },
        "{" + list + "}");
}

namespace {

CLI::Validator readable(const std::string& label, bool directory_ok) {
    return CLI::Validator(
        [label, directory_ok](std::string& s) -> std::string {
            struct stat st {};
            if (::stat(s.c_str(), &st) != 0) {
                const int err = errno;
                if (err == ENOENT) throw UsageError(label + ": " + shown(s) + " does not exist");
                throw UsageError(label + ": " + shown(s) + ": " + errno_text(err));
            }
            if (S_ISDIR(st.st_mode) && !directory_ok)
                throw UsageError(label + ": " + shown(s) + " is a directory; expected a file");
            // Opened once to know it can be read; O_NONBLOCK so a FIFO does not block here.
            const int fd = ::open(s.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
            if (fd < 0)
                throw UsageError(label + ": " + shown(s) + " cannot be read: " + errno_text(errno));
            ::close(fd);
            return {};
        },
        directory_ok ? "PATH" : "FILE");
}

}  // namespace

CLI::Validator readable_file(const std::string& label) { return readable(label, false); }
CLI::Validator readable_path(const std::string& label) { return readable(label, true); }

CLI::Validator parsed_by(std::function<void(const std::string&)> parse) {
    return CLI::Validator(
        [parse = std::move(parse)](std::string& s) -> std::string {
            try {
                parse(s);
            } catch (const Error& e) {
                throw UsageError(e.what());
            }
            return {};
        },
        "");
}

CLI::Option* add_choice_option(CLI::App& app, const std::string& names, std::string& var,
                               std::vector<std::string> choices, const std::string& help) {
    return app.add_option(names, var, help)
        ->capture_default_str()
        ->check(one_of(option_label(names), std::move(choices)));
}

std::string usage_error_message(const CLI::App& app, const CLI::ParseError& e) {
    const std::vector<CLI::App*> parsed = app.get_subcommands();
    const CLI::App* sub = parsed.empty() ? nullptr : parsed.front();
    const std::string where = sub ? "qforge " + sub->get_name() : "qforge";
    const bool extras = dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr;
    const bool required = dynamic_cast<const CLI::RequiredError*>(&e) != nullptr;

    // Something left over is the likelier mistake (a mistyped option or subcommand) than what it
    // left missing, so it is reported first.
    if (extras || required) {
        const std::vector<std::string> left = app.remaining(true);
        if (!left.empty()) {
            const std::string& arg = left.front();
            if (arg.size() > 1 && arg[0] == '-')
                return "unknown option " + shown(arg.substr(0, arg.find('='))) + " for '" + where +
                       "'";
            if (!sub)
                return "unknown subcommand " + shown(arg) +
                       "; expected one of: " + subcommand_names(app);
            return where + ": unexpected argument " + shown(arg) +
                   " (too many arguments; see qforge " + sub->get_name() + " --help)";
        }
    }
    if (required) {
        if (!sub) return "missing subcommand; expected one of: " + subcommand_names(app);
        for (const CLI::Option* opt : sub->get_options())
            if (opt->get_required() && opt->count() == 0)
                return where + ": missing required argument: " + option_display(*opt);
    }
    // CLI11's other messages (this version's wording), made to read like the ones above.
    std::string what = e.what();
    const std::string name = what.substr(0, what.find(':'));
    if (const size_t x = what.find(" excludes "); x != std::string::npos) {
        what.replace(x, 10, " cannot be used with ");
    } else if (const size_t f = what.find(" was given a disallowed flag override");
               f != std::string::npos) {
        // "greedy was given a disallowed flag override": --greedy=2 (main.cpp disables them).
        return where + ": --" + what.substr(0, f) + ": a flag takes no value (use --" +
               what.substr(0, f) + " alone)";
    } else if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
        if (what.find(" missing") != std::string::npos)
            what = name + ": a value is required";
        else if (what.find("At Most") != std::string::npos)
            what = name + ": given more than once";
    }
    return where + ": " + what;
}

void add_threads_option(CLI::App& app, CommonOptions& o) {
    add_int_option(app, "-t,--threads", o.threads, 0, 1024,
                   "worker threads (0 = all hardware threads)");
}

void add_json_option(CLI::App& app, CommonOptions& o) {
    app.add_flag("--json", o.json, "print one JSON object with the results on stdout");
}

void add_seed_option(CLI::App& app, CommonOptions& o) {
    add_int_option(app, "--seed", o.seed, 0, std::numeric_limits<uint64_t>::max(),
                   "random seed; the same seed gives the same output");
}

void add_file_option(CLI::App& app, CommonOptions& o, bool required) {
    auto* opt = add_input_option(app, "-f,--file", o.file, "text file to read");
    if (required) opt->required();
}

void add_cpu_backend_options(CLI::App& app, CommonOptions& o) {
    app.add_flag("--float-activations", o.float_activations,
                 "multiply quantized weights with float32 activations instead of int8 blocks "
                 "(CPU, and CUDA's decode products; exact, slower; to measure what int8 "
                 "activations cost)");
    app.add_flag("--bf16-activations", o.bf16_activations,
                 "multiply bf16 weights with activations rounded to bf16 (AVX-512 BF16: faster "
                 "prefill, inexact; refused on a CPU without it; other weights unchanged)");
    add_choice_option(app, "--kv-type", o.kv_type, {"f32", "f16"},
                      "what the CPU backend's KV cache stores: f32 (exact) or f16 (half the "
                      "memory and the bytes attention reads; keys and values rounded to f16 once; "
                      "the CUDA backend's cache is always f16)");
}

CpuBackendOptions cpu_backend_options(const CommonOptions& o) {
    CpuBackendOptions b;
    b.int8_activations = !o.float_activations;
    b.bf16_activations = o.bf16_activations;
    b.kv_type = *kv_type_from_name(o.kv_type);  // the option's choices are its names
    return b;
}

void add_backend_option(CLI::App& app, CommonOptions& o) {
    std::vector<std::string> names;
    for (const BackendKind k : {BackendKind::auto_select, BackendKind::cpu, BackendKind::cuda})
        names.emplace_back(backend_kind_name(k));
    add_choice_option(app, "--backend", o.backend, std::move(names),
                      "compute backend: auto (cuda when a CUDA device is present, else cpu), cpu, "
                      "cuda");
}

std::unique_ptr<Backend> make_selected_backend(const CommonOptions& o, const Model& model,
                                               ThreadPool& pool) {
    BackendOptions b;
    b.cpu = cpu_backend_options(o);
    b.cuda.int8_activations = !o.float_activations;
    auto backend = make_backend(*backend_kind_from_name(o.backend), model, pool, b);
    if (o.bf16_activations) {
        // The mode touches bf16 matrices only: say so rather than leave an f16 or quantized
        // model's user waiting for a speed-up.
        bool any = model.lm_head().qtype == QType::bf16;
        for (uint64_t layer = 0; layer < model.config().num_layers && !any; ++layer)
            for (int i = 0; i < kBlockLinears; ++i)
                any = any || model.weight(layer, static_cast<Weight>(i)).qtype == QType::bf16;
        if (!any)
            std::fprintf(stderr,
                         "note: %s has no bf16 matrices: --bf16-activations changes nothing "
                         "(convert with --dtype bf16 to use it)\n",
                         model.path().c_str());
    }
    return backend;
}

void print_fp16_saturations(const Backend& backend) {
    if (const uint64_t n = backend.fp16_saturations())
        std::fprintf(stderr,
                     "qforge: warning: the %s backend clamped %llu values beyond fp16's range "
                     "(+-65504) in its fp16 activations or KV cache; results that depend on "
                     "them are approximate\n",
                     std::string(backend.name()).c_str(), static_cast<unsigned long long>(n));
}

int resolved_threads(const CommonOptions& o) {
    if (o.threads > 0) return o.threads;
    const unsigned n = std::thread::hardware_concurrency();
    return n ? static_cast<int>(n) : 1;
}

std::unique_ptr<QfInput> open_qf_input(const std::string& input) {
    auto in = std::make_unique<QfInput>(input);
    for (const auto& w : in->report().warnings)
        std::fprintf(stderr, "qforge: warning: %s\n", w.c_str());
    return in;
}

std::string read_text_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path, {}, "cannot read the file");
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace qforge::cli
