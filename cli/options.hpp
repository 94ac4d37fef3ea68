// Options shared by subcommands, and the one way every option is declared and checked. Each flag
// is defined once here, so the same flag means the same thing (name, default, help text,
// validation) in every subcommand that takes it.
//
// The CLI's contract (README.md, "Errors and exit codes"): exit 0 on success, 1 when the work
// fails (a bad input file, an I/O error), 2 for a usage error (a bad, missing or unknown option or
// value, an unknown subcommand, an extra argument). Every error is one line on stderr,
// "qforge: error: ...", naming the option, the value and what was expected. Every option value is
// checked while the command line is parsed, before any work starts.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "convert/qf_input.hpp"
#include "runtime/backend.hpp"
#include "runtime/backend_factory.hpp"

namespace qforge::cli {

// A usage error: main prints its message after "qforge: error: " and exits 2. Thrown by the
// validators below while parsing, and by runners for combinations of options that do not go
// together (checked before any work).
class UsageError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

inline constexpr int kExitFailure = 1;  // the work failed: bad input file, I/O error, ...
inline constexpr int kExitUsage = 2;    // the command line is wrong

struct CommonOptions {
    int threads = 0;                 // 0: all hardware threads
    bool json = false;               // machine-readable result on stdout
    uint64_t seed = 42;              // every random choice derives from it
    std::string file;                // text input (-f/--file)
    bool quiet = false;              // no progress bars
    bool float_activations = false;  // quantized matrices times float32 (not int8) activations
    bool bf16_activations = false;   // bf16 matrices times bf16-rounded activations (AVX-512 BF16)
    std::string kv_type = "f32";     // the CPU backend's KV cache elements (runtime/kv_cache.hpp)
    std::string backend = "auto";    // --backend: auto (cuda when a device is present), cpu, cuda
};

// "-n,--gen,--decode" -> "-n/--gen": the short name and the first long name, as messages show
// an option.
std::string option_label(const std::string& names);

// "a, b, c": a list of names as help texts and messages show it.
std::string join_names(const std::vector<std::string>& names);

// Validators. Each throws UsageError naming `label`, the value and what is allowed. The integer
// and real ones rewrite the value in canonical form, so CLI11's own conversion that follows is
// exact (no octal "010", no hexadecimal, no wrap-around of "-1" into an unsigned type); they are
// added with transform(), as check() hands a validator a copy.
CLI::Validator integer_range(const std::string& label, uint64_t min, uint64_t max);
struct RealBound {
    double value;
    bool inclusive;
};
// `as_float`: the value is stored as a float; its float rounding must also be in range.
CLI::Validator real_range(const std::string& label, RealBound lo, RealBound hi, bool as_float);
CLI::Validator one_of(const std::string& label, std::vector<std::string> choices);
// An existing, readable file that is not a directory.
CLI::Validator readable_file(const std::string& label);
// An existing, readable file or directory.
CLI::Validator readable_path(const std::string& label);
// Runs `parse` (a library's name parser that throws qforge::Error naming the option) on the value.
CLI::Validator parsed_by(std::function<void(const std::string&)> parse);

// An integer option in [min, max] (decimal only; negative and non-numeric values refused).
template <class T>
CLI::Option* add_int_option(CLI::App& app, const std::string& names, T& var, uint64_t min,
                            uint64_t max, const std::string& help) {
    static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
    if (max > static_cast<uint64_t>(std::numeric_limits<T>::max()) || min > max)
        throw std::logic_error("add_int_option " + names + ": bad range");
    return app.add_option(names, var, help)
        ->capture_default_str()
        ->transform(integer_range(option_label(names), min, max));
}

// A real option between lo and hi (each bound inclusive or not; NaN and infinities refused).
template <class T>
CLI::Option* add_real_option(CLI::App& app, const std::string& names, T& var, RealBound lo,
                             RealBound hi, const std::string& help) {
    static_assert(std::is_floating_point_v<T>);
    return app.add_option(names, var, help)
        ->capture_default_str()
        ->transform(real_range(option_label(names), lo, hi, std::is_same_v<T, float>));
}

// A string option whose value is one of `choices`.
CLI::Option* add_choice_option(CLI::App& app, const std::string& names, std::string& var,
                               std::vector<std::string> choices, const std::string& help);

// A file or directory argument that must exist and be readable (a positional name, or an option
// as "-f,--file"); directories refused unless `directory_ok`.
template <class T>
CLI::Option* add_input_option(CLI::App& app, const std::string& names, T& var,
                              const std::string& help, bool directory_ok = false) {
    const std::string label = option_label(names);
    return app.add_option(names, var, help)
        ->check(directory_ok ? readable_path(label) : readable_file(label));
}

// Turns a CLI11 parse error into the one line printed after "qforge: error: " (unknown options
// and subcommands, missing arguments and values, extra arguments), naming the subcommand.
std::string usage_error_message(const CLI::App& app, const CLI::ParseError& e);

void add_threads_option(CLI::App& app, CommonOptions& o);
void add_json_option(CLI::App& app, CommonOptions& o);
void add_seed_option(CLI::App& app, CommonOptions& o);
void add_file_option(CLI::App& app, CommonOptions& o, bool required);

// --float-activations (runtime options of the CPU backend).
void add_cpu_backend_options(CLI::App& app, CommonOptions& o);
CpuBackendOptions cpu_backend_options(const CommonOptions& o);

// --backend auto|cpu|cuda, and the backend it selects for a model (options of both backends).
void add_backend_option(CLI::App& app, CommonOptions& o);
std::unique_ptr<Backend> make_selected_backend(const CommonOptions& o, const Model& model,
                                               ThreadPool& pool);
// A warning on stderr when the backend clamped values to fp16's range (Backend::
// fp16_saturations); nothing when it did not.
void print_fp16_saturations(const Backend& backend);

// The bytes of a text file given on the command line (an Error naming it when unreadable).
std::string read_text_file(const std::string& path);

// Threads to use: the --threads value, or the hardware's count when 0.
int resolved_threads(const CommonOptions& o);

// Help text of a model argument that takes any input kind.
inline constexpr const char* model_input_help =
    ".qf model, or any input `convert` takes (Hugging Face directory or .safetensors, GGUF, "
    "llama2.c .bin: converted to a temporary .qf first)";

// A model argument of a command that runs or reads a .qf (a file, or a Hugging Face directory).
inline CLI::Option* add_model_input(CLI::App& app, const std::string& names, std::string& var,
                                    const std::string& help = model_input_help) {
    return add_input_option(app, names, var, help, true);
}

// The model argument of a command that runs or reads a .qf: any input kind, converted to a
// temporary .qf when it is not one (convert/qf_input.hpp), the conversion's warnings printed.
std::unique_ptr<QfInput> open_qf_input(const std::string& input);

}  // namespace qforge::cli
