// Options shared by subcommands. Each flag is defined once here, so the same flag means the same
// thing (name, default, help text, validation) in every subcommand that takes it.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "runtime/backend.hpp"
#include "runtime/backend_factory.hpp"

namespace qforge::cli {

struct CommonOptions {
    int threads = 0;      // 0: all hardware threads
    bool json = false;    // machine-readable result on stdout
    uint64_t seed = 42;   // every random choice derives from it
    std::string file;     // text input (-f/--file)
    bool quiet = false;   // no progress bars
    bool float_activations = false;  // quantized matrices times float32 (not int8) activations
    std::string backend = "auto";    // --backend: auto (cuda when a device is present), cpu, cuda
};

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

// Threads to use: the --threads value, or the hardware's count when 0.
int resolved_threads(const CommonOptions& o);

}  // namespace qforge::cli
