#include "options.hpp"

#include <thread>

namespace qforge::cli {

void add_threads_option(CLI::App& app, CommonOptions& o) {
    app.add_option("-t,--threads", o.threads, "worker threads (0 = all hardware threads)")
        ->check(CLI::Range(0, 1024));
}

void add_json_option(CLI::App& app, CommonOptions& o) {
    app.add_flag("--json", o.json, "print one JSON object with the results on stdout");
}

void add_seed_option(CLI::App& app, CommonOptions& o) {
    app.add_option("--seed", o.seed, "random seed; the same seed gives the same output")
        ->capture_default_str();
}

void add_file_option(CLI::App& app, CommonOptions& o, bool required) {
    auto* opt = app.add_option("-f,--file", o.file, "text file to read")->check(CLI::ExistingFile);
    if (required) opt->required();
}

void add_cpu_backend_options(CLI::App& app, CommonOptions& o) {
    app.add_flag("--float-activations", o.float_activations,
                 "multiply quantized weights with float32 activations instead of int8 blocks "
                 "(exact, slower; to measure what int8 activations cost)");
}

CpuBackendOptions cpu_backend_options(const CommonOptions& o) {
    CpuBackendOptions b;
    b.int8_activations = !o.float_activations;
    return b;
}

void add_backend_option(CLI::App& app, CommonOptions& o) {
    app.add_option("--backend", o.backend,
                   "compute backend: auto (cuda when a CUDA device is present, else cpu), cpu, cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

std::unique_ptr<Backend> make_selected_backend(const CommonOptions& o, const Model& model,
                                               ThreadPool& pool) {
    BackendOptions b;
    b.cpu = cpu_backend_options(o);
    return make_backend(*backend_kind_from_name(o.backend), model, pool, b);
}

int resolved_threads(const CommonOptions& o) {
    if (o.threads > 0) return o.threads;
    const unsigned n = std::thread::hardware_concurrency();
    return n ? static_cast<int>(n) : 1;
}

}  // namespace qforge::cli
