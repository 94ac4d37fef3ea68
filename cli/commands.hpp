// Each subcommand registers its options on the app and returns the function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "options.hpp"

namespace qforge::cli {

using Runner = std::function<int()>;

Runner register_convert(CLI::App& app, CommonOptions& common);
Runner register_quantize(CLI::App& app, CommonOptions& common);
Runner register_inspect(CLI::App& app, CommonOptions& common);
Runner register_verify(CLI::App& app, CommonOptions& common);
Runner register_tokenize(CLI::App& app, CommonOptions& common);
Runner register_ppl(CLI::App& app, CommonOptions& common);
Runner register_generate(CLI::App& app, CommonOptions& common);
Runner register_bench(CLI::App& app, CommonOptions& common);
Runner register_export(CLI::App& app, CommonOptions& common);
Runner register_serve(CLI::App& app, CommonOptions& common);

}  // namespace qforge::cli
