// qforge quantize: any model source (sources/model_source.hpp) to a quantized .qf
// (quant/quantize_model.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "convert/input_files.hpp"
#include "core/error.hpp"
#include "core/output_path.hpp"
#include "core/progress.hpp"
#include "formats/architectures.hpp"
#include "quant/gptq.hpp"
#include "quant/quantize_model.hpp"

namespace qforge::cli {

namespace {

using nlohmann::json;

double bits_per_weight(uint64_t bytes, uint64_t parameters) {
    return parameters ? 8.0 * static_cast<double>(bytes) / static_cast<double>(parameters) : 0.0;
}

void print_plan(const std::vector<TensorPlan>& plan) {
    for (const auto& g : group_plan(plan))
        std::fprintf(stderr, "qforge: quantize: %-10s %3llu tensor%s -> %-8s %s\n",
                     std::string(tensor_class_name(g.cls)).c_str(), (unsigned long long)g.tensors,
                     g.tensors == 1 ? " " : "s", std::string(qtype_traits(g.qtype).name).c_str(),
                     g.reason.c_str());
}

json report_json(const QuantizeOptions& o, const QuantizeReport& r, int threads) {
    json tensors = json::array();
    for (const auto& t : r.tensors)
        tensors.push_back({{"name", t.name},
                           {"class", tensor_class_name(t.cls)},
                           {"source_qtype", qtype_traits(t.source).name},
                           {"qtype", qtype_traits(t.qtype).name},
                           {"shape", t.shape},
                           {"parameters", t.parameters},
                           {"bytes", t.bytes},
                           {"bits_per_weight", bits_per_weight(t.bytes, t.parameters)},
                           {"copied", t.copied}});
    json classes = json::array();
    for (const auto& g : r.groups)
        classes.push_back({{"class", tensor_class_name(g.cls)},
                           {"qtype", qtype_traits(g.qtype).name},
                           {"tensors", g.tensors},
                           {"reason", g.reason}});
    json j = recipe_to_json(o.recipe);
    j.update({{"input", o.input},
              {"output", o.output},
              {"classes", std::move(classes)},
              {"tensors", std::move(tensors)},
              {"totals",
               {{"tensors", r.tensors.size()},
                {"parameters", r.parameters},
                {"bytes", r.tensor_bytes},
                {"file_bytes", r.bytes_written},
                {"bits_per_weight", bits_per_weight(r.tensor_bytes, r.parameters)},
                {"file_bits_per_weight", bits_per_weight(r.bytes_written, r.parameters)}}},
              {"seconds", r.seconds},
              {"threads", threads},
              {"tokenizer", r.tokenizer},
              {"warnings", r.warnings}});
    if (!r.linears.empty()) {
        json linears = json::array();
        for (const auto& l : r.linears)
            linears.push_back({{"name", l.name},
                               {"qtype", l.qtype},
                               {"relative_error", l.relative_error},
                               {"rtn_relative_error", l.rtn_relative_error},
                               {"damp", l.damp},
                               {"damp_raises", l.damp_raises}});
        j["linears"] = std::move(linears);
    }
    if (!r.size_plan.is_null()) j["size_plan"] = r.size_plan;
    return j;
}

}  // namespace

namespace {

// Our names of the tensors of the architecture table's rows that pass `keep`, "layers.N." for
// the per-layer ones (every architecture names its tensors alike).
template <typename Keep>
std::string tensor_names(Keep keep) {
    std::string names;
    for (const TensorRow& row : tensor_rows(Architecture::llama)) {
        if (!keep(row)) continue;
        std::string name(row.name_pattern);
        if (const auto at = name.find("{i}"); at != std::string::npos) name.replace(at, 3, "N");
        names += (names.empty() ? "" : ", ") + name;
    }
    return names;
}

std::string tensor_names_help() {
    return tensor_names([](const TensorRow&) { return true; });
}

// "embedding (the token embedding, a row lookup: embed; any qtype), ...".
std::string tensor_classes_help() {
    std::string text;
    for (const WeightClassInfo& c : weight_classes())
        text += (text.empty() ? "" : "; ") + std::string(c.name) + " (" + std::string(c.what) +
                ": " + tensor_names([&](const TensorRow& row) { return row.cls == c.cls; }) +
                (c.least == LeastPrecision::float16 ? "; float only: f32, f16 or bf16)"
                                                    : "; any qtype)");
    return text;
}

// "q3 = q3k_g32 (3.5 bits per weight: ...), ...".
std::string qtype_families_help() {
    std::string text;
    for (const QTypeFamily& f : kQTypeFamilies)
        text += (text.empty() ? "" : ", ") + std::string(f.name) + " = " +
                std::string(qtype_traits(f.member).name) + " (" + std::string(f.why) + ")";
    return text;
}

// "rtn 128, gptq 128, ...": one default of every method, for help texts.
template <typename Field>
std::string method_defaults_help(Field field) {
    std::string text;
    for (const QuantMethodInfo& m : kQuantMethods)
        text += (text.empty() ? "" : ", ") + std::string(m.name) + " " + field(m.defaults);
    return text;
}

std::string on_off(bool on) { return on ? "on" : "off"; }

// --NAME and --no-NAME: set `choice` to true or false (unset: the method's default).
void add_choice_flags(CLI::App& app, const std::string& name, std::optional<bool>& choice,
                      const std::string& help) {
    app.add_flag_callback(
        "--" + name, [&choice] { choice = true; }, help);
    app.add_flag_callback(
        "--no-" + name, [&choice] { choice = false; }, "turns --" + name + " off");
}

// "91500000", "91.5M", "87GiB": decimal units (k, M, G: powers of 1000) or binary ones (KiB, MiB,
// GiB). Throws UsageError.
uint64_t parse_size(const std::string& text) {
    static const std::pair<const char*, double> kUnits[] = {
        {"", 1.0},  {"k", 1e3},      {"K", 1e3},         {"M", 1e6},
        {"G", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
    size_t used = 0;
    double v = 0.0;
    try {
        v = std::stod(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    const std::string unit = text.substr(used);
    for (const auto& [name, scale] : kUnits)
        if (used > 0 && unit == name && std::isfinite(v) && v > 0.0 && v * scale < 1e18)
            return static_cast<uint64_t>(v * scale);
    throw UsageError("--target-size: '" + text +
                     "' is not a size: a positive number of bytes, optionally with k, M, G "
                     "(powers of 1000) or KiB, MiB, GiB");
}

std::vector<QType> parse_type_list(const std::string& text) {
    std::vector<QType> out;
    size_t at = 0;
    while (at <= text.size()) {
        const size_t comma = std::min(text.find(',', at), text.size());
        const QType q = parse_qtype_name(text.substr(at, comma - at), "--plan-types");
        if (!qtype_is_quantized(q))
            throw UsageError("--plan-types: " + std::string(qtype_traits(q).name) +
                             " is not a quantized type");
        if (std::find(out.begin(), out.end(), q) == out.end()) out.push_back(q);
        at = comma + 1;
    }
    return out;
}

}  // namespace

Runner register_quantize(CLI::App& app, CommonOptions& common) {
    struct Args {
        QuantizeOptions opts;
        std::string method = "rtn", qtype;
        std::vector<std::string> tensor_types;
        MethodChoices choices;
        std::string target_size, plan_types;
        std::string calib_products = "auto";
    };
    auto a = std::make_shared<Args>();
    add_input_option(app, "input", a->opts.input,
                     ".qf file, Hugging Face directory or .safetensors file, GGUF or llama2.c "
                     ".bin (read directly, no convert step)",
                     true)
        ->required();
    app.add_option("-o,--output", a->opts.output, "output .qf file")->required();
    app.add_option("--method", a->method,
                   "rtn (round to nearest per group, no data); gptq, awq or awq+gptq "
                   "(layer-sequential, with --calib text; awq+gptq: AWQ's scales and clipping, "
                   "then GPTQ instead of RTN)")
        ->capture_default_str()
        ->check(parsed_by([](const std::string& s) { parse_quant_method(s); }));
    CalibratedOptions& co = a->opts.calibrated;
    add_input_option(app, "--calib", co.calibration.files,
                     "calibration text files (plain text; gptq, awq; rtn: importance-weighted): "
                     "random windows of --seqlen tokens")
        ->take_all();
    MethodChoices& mc = a->choices;
    app.add_option(
           "--nsamples", mc.nsamples,
           "calibration windows (default: " + method_defaults_help([](const MethodDefaults& d) {
               return std::to_string(d.nsamples);
           }) + ")")
        ->transform(integer_range("--nsamples", 1, uint64_t{1} << 20));
    add_int_option(app, "--seqlen", co.calibration.seqlen, 2, uint64_t{1} << 20,
                   "tokens per calibration window (capped at the model's context)");
    // GPTQ raises a damp that fails up to kGptqMaxDamp (the mean diagonal itself); 0 starts
    // from no dampening at all.
    app.add_option(
           "--damp", mc.damp,
           "GPTQ dampening: this fraction of the mean diagonal of H is added to it; "
           "raised automatically (and reported) when the Cholesky factorization fails "
           "(default: " +
               method_defaults_help([](const MethodDefaults& d) { return json(d.damp).dump(); }) +
               ")")
        ->transform(real_range("--damp", {0.0, true}, {kGptqMaxDamp, true}, false));
    add_choice_flags(
        app, "act-order", mc.act_order,
        "GPTQ: quantize columns by decreasing activation energy (diag H), always with "
        "static groups, so inference needs no permutation (default: " +
            method_defaults_help([](const MethodDefaults& d) { return on_off(d.act_order); }) +
            ")");
    add_choice_flags(
        app, "refit", mc.refit,
        "GPTQ: after the column loop, move each group's scale (and min) to the least-squares "
        "values for its codes on the full H, keeping a row's new grids only when its output "
        "error is lower (default: " +
            method_defaults_help([](const MethodDefaults& d) { return on_off(d.refit); }) + ")");
    add_choice_flags(app, "mse", mc.mse,
                     "GPTQ: choose each group's grid by shrinking its range (1.0 down to 0.21 in "
                     "steps of 0.01) for the least sum |w - q|^2.4, as GPTQModel's mse option; "
                     "clips outliers; replaces the default importance search (default: off)");
    add_choice_flags(
        app, "importance", mc.importance,
        "every method: choose each group's scale and zero for the least error weighted by the "
        "mean squared activation of its input columns on the --calib text (diag H); with "
        "--method rtn it applies when --calib is given (one calibration pass) (default: " +
            method_defaults_help([](const MethodDefaults& d) { return on_off(d.importance); }) +
            ")");
    app.add_option("--calib-products", a->calib_products,
                   "calibrated methods: the precision of the calibration forward's products "
                   "(linears and attention) and of the Hessians: bf16 (inputs rounded to bf16, "
                   "exact products summed in f32 by AVX-512 BF16 or AMX, twice as fast and more; "
                   "as GPU tools calibrate in bf16/fp16), f32 "
                   "(exact float32), or auto: bf16 where the CPU has AVX-512 BF16, else f32")
        ->capture_default_str()
        ->check(parsed_by([](const std::string& s) { parse_calib_products(s); }));
    app.add_option("--resume", co.resume_dir,
                   "calibrated methods: save each finished block's state in DIR (created if "
                   "absent); a rerun with the same DIR, input, recipe and calibration continues "
                   "after the last saved block and writes a byte-identical file. A DIR from a "
                   "different run is refused. DIR is kept; delete it when done.");
    add_seed_option(app, common);
    app.add_option("--qtype", a->qtype,
                   "the default type: " + qtype_names() +
                       "; or a family, standing for its default member: " + qtype_families_help())
        ->required()
        ->check(parsed_by([](const std::string& s) { parse_qtype_name(s); }));
    app.add_option("--tensor-type", a->tensor_types,
                   "REGEX=TYPE: store tensors whose name contains a match of REGEX (ECMAScript, "
                   "searched anywhere in the name as llama-quantize's --tensor-type; anchor with ^ "
                   "and $) as TYPE. Repeatable; the first matching override wins. Quantized types "
                   "apply to matrices only. Names: " +
                       tensor_names_help())
        ->take_all()
        ->check(parsed_by([](const std::string& s) { parse_tensor_type_override(s); }));
    auto* size_opt = app.add_option(
        "--target-size", a->target_size,
        "mixed precision: the whole output file within this size (bytes, or with k/M/G or "
        "KiB/MiB/GiB). Each matrix the default policy would quantize gets the --plan-types type "
        "that minimises the sum of the measured KL divergences (each tensor alone in each type, "
        "on the first --plan-tokens calibration tokens); needs --calib and a float .qf input");
    auto* bpw_opt =
        app.add_option("--target-bpw", a->opts.target.bpw,
                       "mixed precision as --target-size, the size given as bits per weight "
                       "of the whole file over the model's parameters")
            ->transform(real_range("--target-bpw", {0.0, false}, {64.0, true}, false));
    size_opt->excludes(bpw_opt);
    bpw_opt->excludes(size_opt);
    {
        std::string names;
        for (QType q : kSizePlanTypes)
            names += (names.empty() ? "" : ",") + std::string(qtype_traits(q).name);
        app.add_option("--plan-types", a->plan_types,
                       "the size plan's candidate types, comma-separated (default: " + names + ")");
    }
    add_int_option(app, "--plan-tokens", a->opts.target.tokens, 1, uint64_t{1} << 24,
                   "calibration tokens the size plan measures on, in whole --seqlen windows "
                   "(at least one)");
    add_input_option(app, "--tokenizer", a->opts.tokenizer,
                     "checkpoint input: tokenizer.json or llama2.c .bin to embed (default: found "
                     "beside the checkpoint, or a GGUF's own)");
    add_threads_option(app, common);
    add_json_option(app, common);
    app.footer(
        "Default policy (overrides first): 1-D tensors (norms, biases) are stored f32; the output "
        "head (lm_head, or the tied embedding that serves as it) gets at least 8 bits (q8_g32 "
        "under a 4-bit --qtype); every other matrix, the untied embedding included, gets --qtype, "
        "unless its rows are too short for the packed form to be smaller than the source's float "
        "rows. The decision for each class is printed on stderr and recorded in the .qf header. "
        "The output is byte-identical whatever --threads is.\n\nTensor classes (the "
        "architecture table, formats/architectures.hpp): " +
        tensor_classes_help());

    return [a, &common]() {
        // Every option is checked before the input is opened.
        a->opts.recipe.method = parse_quant_method(a->method);
        a->opts.recipe.qtype = parse_qtype_name(a->qtype);
        for (const auto& spec : a->tensor_types)
            a->opts.recipe.overrides.push_back(parse_tensor_type_override(spec));
        a->opts.threads = resolved_threads(common);
        a->opts.calibrated.calibration.seed = common.seed;
        if (!a->target_size.empty()) a->opts.target.bytes = parse_size(a->target_size);
        try {
            if (!a->plan_types.empty()) a->opts.target.qtypes = parse_type_list(a->plan_types);
        } catch (const Error& e) {
            throw UsageError(e.detail());
        }
        if (a->opts.target.set() && a->opts.calibrated.calibration.files.empty())
            throw UsageError(
                "--target-size/--target-bpw measure each tensor on calibration text: --calib FILE");
        CalibratedOptions& cal = a->opts.calibrated;
        const bool calibrated = quant_method_info(a->opts.recipe.method).calibrated;
        if (calibrated && cal.calibration.files.empty())
            throw UsageError("--method " + a->method + " needs calibration text: --calib FILE");
        try {
            resolve_method_options(a->opts.recipe.method, a->choices, cal);
            cal.products = parse_calib_products(a->calib_products);
        } catch (const Error& e) {
            throw UsageError(e.detail());
        }
        if (!calibrated && !cal.importance && !cal.resume_dir.empty())
            throw UsageError(
                "--resume is for calibrated methods (gptq, awq, rtn --calib); "
                "--method " +
                a->method + " runs in one pass");

        // Nothing the run reads or keeps (inputs, calibration text, --resume state) is the output.
        std::vector<std::string> inputs = checkpoint_input_files(a->opts.input, a->opts.tokenizer);
        for (const auto& f : a->opts.calibrated.calibration.files) inputs.push_back(f);
        check_output_path(a->opts.output, inputs);
        check_state_dir(a->opts.calibrated.resume_dir, a->opts.output, inputs);

        QuantizeReport r = quantize_model(a->opts, print_plan);
        for (const auto& w : r.warnings) std::fprintf(stderr, "qforge: warning: %s\n", w.c_str());
        if (common.json) {
            std::printf("%s\n", report_json(a->opts, r, a->opts.threads).dump(2).c_str());
        } else {
            std::printf(
                "wrote %s: %zu tensors, %llu parameters, %s, %.3f bits per weight (%.3f counting "
                "the whole file), %.1f s\n",
                a->opts.output.c_str(), r.tensors.size(), (unsigned long long)r.parameters,
                human_bytes(r.bytes_written).c_str(), bits_per_weight(r.tensor_bytes, r.parameters),
                bits_per_weight(r.bytes_written, r.parameters), r.seconds);
        }
        return 0;
    };
}

}  // namespace qforge::cli
