#include "quant/quantize_model.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "core/alloc.hpp"
#include "core/error.hpp"
#include "core/progress.hpp"
#include "formats/qf.hpp"
#include "formats/qf_validate.hpp"
#include "quant/gptq.hpp"
#include "quant/rtn.hpp"
#include "runtime/model.hpp"
#include "runtime/thread_pool.hpp"
#include "sources/model_source.hpp"
#include "tokenizer/tokenizer.hpp"

namespace qforge {

namespace {

using nlohmann::json;

std::string value_text(float f) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
    return buf;
}

std::string failure_text(const RowFailure& f, uint64_t rows, QType target) {
    const std::string where =
        rows == 1 ? "element " + std::to_string(f.col)
                  : "row " + std::to_string(f.row) + ", column " + std::to_string(f.col);
    if (f.status == QuantStatus::non_finite)
        return where + " is " + value_text(f.value) + " (weights must be finite)";
    if (qtype_is_quantized(target))
        return where + ": " + value_text(f.value) + " is too large for " +
               std::string(qtype_traits(target).name) + " (its group's scale overflows fp16)";
    return where + " = " + value_text(f.value) + " overflows " +
           std::string(qtype_traits(target).name);
}

json quantization_record(const QuantRecipe& recipe, const std::vector<PlanGroup>& groups,
                         const std::vector<TensorPlan>& plan) {
    json q = recipe_to_json(recipe);
    json classes = json::array();
    for (const auto& g : groups)
        classes.push_back({{"class", tensor_class_name(g.cls)},
                           {"qtype", qtype_traits(g.qtype).name},
                           {"tensors", g.tensors},
                           {"reason", g.reason}});
    std::map<std::string, uint64_t> counts;
    for (const auto& p : plan) counts[std::string(qtype_traits(p.choice.qtype).name)] += 1;
    q["classes"] = std::move(classes);
    q["qtypes"] = counts;
    q["version"] = QFORGE_VERSION;
    return q;
}

json provenance(const ModelSource& src, const json& quantization) {
    json p = {
        {"generator", {{"name", "qforge"}, {"version", QFORGE_VERSION}}},
        {"sources", src.sources()},
        {"recipe", {{"command", "quantize"}, {"source_format", src.format()}}},
        {"quantization", quantization},
    };
    if (!src.input_provenance().is_null()) p["input_provenance"] = src.input_provenance();
    return p;
}

// The calibration windows (quant/calibration.hpp), when the method, importance-weighted grids or
// a size target read text; null otherwise.
std::unique_ptr<CalibrationSet> calibration_set(const QuantizeOptions& options,
                                                const ModelSource& source) {
    if (!quant_method_info(options.recipe.method).calibrated && !options.calibrated.importance &&
        !options.target.set())
        return nullptr;
    if (source.tokenizer().is_null())
        throw Error(options.input, {}, "calibration needs the model's tokenizer, and it has none");
    const Tokenizer tok = Tokenizer::from_schema(source.tokenizer(), options.input);
    CalibrationOptions co = options.calibrated.calibration;
    co.seqlen = std::min<uint64_t>(co.seqlen, source.config().max_position_embeddings);
    return std::make_unique<CalibrationSet>(make_calibration_set(tok, co));
}

// Calibrated methods: the layer-sequential engine that produces the blocks' linears (null for
// RTN without importance).
std::unique_ptr<LayerSequential> make_engine(const QuantizeOptions& options,
                                             const QuantRecipe& recipe, const ModelSource& source,
                                             const std::vector<TensorPlan>& plan,
                                             const CalibrationSet* calibration, ThreadPool& pool) {
    if (!quant_method_info(recipe.method).calibrated && !options.calibrated.importance)
        return nullptr;
    std::vector<QType> qtypes;
    for (const auto& p : plan) qtypes.push_back(p.choice.qtype);
    CalibratedOptions engine_options = options.calibrated;
    engine_options.method = recipe.method;
    std::unique_ptr<ResumeDir> resume;
    if (!options.calibrated.resume_dir.empty()) {
        // What makes the blocks' results what they are; the thread count does not.
        const json fingerprint = {{"qforge_version", QFORGE_VERSION},
                                  {"sources", source.sources()},
                                  {"recipe", recipe_to_json(recipe)},
                                  {"options",
                                   {{"damp", engine_options.damp},
                                    {"act_order", engine_options.act_order},
                                    {"refit", engine_options.refit},
                                    {"mse", engine_options.mse},
                                    {"importance", engine_options.importance},
                                    {"products", calib_products_name(engine_options.products)}}},
                                  {"calibration", calibration->to_json()},
                                  {"calibration_tokens", calibration->tokens_hash}};
        resume = std::make_unique<ResumeDir>(options.calibrated.resume_dir, fingerprint,
                                             source.config().num_layers);
    }
    return std::make_unique<LayerSequential>(source, std::move(qtypes), *calibration,
                                             engine_options, pool, std::move(resume));
}

uint64_t aligned(uint64_t bytes) { return (bytes + 63) / 64 * 64; }

std::string regex_escaped(const std::string& name) {
    std::string out;
    for (char ch : name) {
        if (std::string_view("\\^$.|?*+()[]{}").find(ch) != std::string_view::npos) out += '\\';
        out += ch;
    }
    return out;
}

// --target-size / --target-bpw (quant/size_plan.hpp): measures the tensors the recipe leaves to
// its default policy, allocates the budget, and turns the choices into overrides appended to
// `recipe` (after the user's, which keep their tensors) and into `plan`. Returns the header's
// size_plan record. `header_bytes`: what the rest of the file will take besides the tensors.
json plan_to_size(const QuantizeOptions& options, const ModelSource& src,
                  std::vector<TensorPlan>& plan, QuantRecipe& recipe,
                  const CalibrationSet& calibration, ThreadPool& pool, uint64_t header_bytes) {
    const SizeTarget& target = options.target;
    if (src.format() != "qf")
        throw Error(options.input, {},
                    "--target-size/--target-bpw measure each tensor on the float model as a .qf: "
                    "convert it first (qforge convert INPUT -o MODEL.qf) and quantize that");
    uint64_t parameters = 0, fixed = 0, planned_names = 0;
    std::vector<SensitivityRequest> requests;
    std::vector<size_t> index;  // plan index of each request
    for (size_t i = 0; i < plan.size(); ++i) {
        const TensorPlan& p = plan[i];
        parameters += checked_product(p.shape).value_or(0);
        std::vector<QType> qtypes;
        if (p.choice.override_index < 0 && p.shape.size() == 2 &&
            qtype_is_quantized(p.choice.qtype) && !qtype_is_quantized(p.source))
            for (QType q : target.qtypes)
                if (qtype_tensor_bytes(q, p.shape)) qtypes.push_back(q);
        if (qtypes.empty()) {
            fixed += aligned(qtype_tensor_bytes(p.choice.qtype, p.shape).value_or(0));
            continue;
        }
        requests.push_back({p.name, std::move(qtypes)});
        index.push_back(i);
        planned_names += p.name.size();
    }
    const uint64_t target_bytes =
        target.bytes > 0
            ? target.bytes
            : static_cast<uint64_t>(target.bpw * static_cast<double>(parameters) / 8.0);
    // The plan adds to the header: per planned tensor its override, its size_plan entry and a
    // calibrated method's report (35, 161 and 155 bytes as compact JSON on SmolLM2-135M; the
    // writer's indented text is up to ~40% more), allowed 600 bytes; the whole file is checked
    // against the target before it is finished.
    const uint64_t overhead = header_bytes + requests.size() * 600 + 2 * planned_names;
    auto mb = [](uint64_t b) { return std::to_string(static_cast<double>(b) / 1e6) + " MB"; };
    if (requests.empty())
        throw Error(options.input, {},
                    "--target-size: no tensor is left to the plan (every matrix has an override "
                    "or cannot take the candidate types)");
    if (fixed + overhead >= target_bytes)
        throw Error(options.input, {},
                    "--target-size: " + mb(target_bytes) +
                        " is below what the tensors outside "
                        "the plan and the header take (" +
                        mb(fixed + overhead) + ")");
    const uint64_t budget = target_bytes - fixed - overhead;

    const Model model(options.input);
    uint64_t total = 0;
    for (const auto& r : requests) total += r.qtypes.size();
    Progress measuring("size plan: tensor x type", total, Progress::Unit::items);
    const auto items =
        measure_sensitivity(model, calibration, target.tokens, requests, pool,
                            [&](uint64_t done, uint64_t) { measuring.update(done); });
    measuring.finish();
    const auto choice = allocate_budget(items, budget);
    if (!choice) {
        uint64_t least = 0;
        for (const auto& it : items) {
            uint64_t m = UINT64_MAX;
            for (const auto& c : it.candidates) m = std::min(m, c.bytes);
            least += m;
        }
        throw Error(options.input, {},
                    "--target-size: " + mb(target_bytes) +
                        " cannot be met: the smallest "
                        "candidate types need " +
                        mb(least + fixed + overhead) + " (add a smaller type to --plan-types)");
    }
    json tensors = json::array();
    double predicted = 0.0;
    uint64_t planned_bytes = 0;
    for (size_t r = 0; r < items.size(); ++r) {
        const SizeCandidate& c = items[r].candidates[(*choice)[r]];
        TensorPlan& p = plan[index[r]];
        const std::string text =
            "^" + regex_escaped(p.name) + "$=" + std::string(qtype_traits(c.qtype).name);
        recipe.overrides.push_back(parse_tensor_type_override(text));
        p.choice.qtype = c.qtype;
        p.choice.override_index = static_cast<int>(recipe.overrides.size()) - 1;
        p.choice.reason = "size plan: least total divergence within the target";
        predicted += c.kld;
        planned_bytes += c.bytes;
        json kld = json::object();
        for (const auto& cand : items[r].candidates)
            kld[std::string(qtype_traits(cand.qtype).name)] = cand.kld;
        tensors.push_back({{"name", p.name},
                           {"qtype", qtype_traits(c.qtype).name},
                           {"bytes", c.bytes},
                           {"kld", kld}});
    }
    json candidates = json::array();
    for (QType q : target.qtypes) candidates.push_back(qtype_traits(q).name);
    json rec = {{"target_bytes", target_bytes},
                {"budget_bytes", budget},
                {"planned_bytes", planned_bytes},
                {"fixed_bytes", fixed},
                {"candidates", candidates},
                {"tokens", target.tokens},
                {"windows",
                 std::clamp<uint64_t>(target.tokens / calibration.seqlen, 1, calibration.nsamples)},
                {"measure", "RTN, one tensor at a time, mean KL divergence from the float model"},
                {"predicted_kld", predicted},
                {"tensors", tensors}};
    if (target.bpw > 0.0) rec["target_bpw"] = target.bpw;
    std::fprintf(stderr,
                 "qforge: quantize: size plan: %zu tensors in %s of %s (the rest %s), predicted "
                 "KLD %.5f\n",
                 items.size(), mb(planned_bytes).c_str(), mb(target_bytes).c_str(),
                 mb(fixed + overhead).c_str(), predicted);
    return rec;
}

}  // namespace

std::vector<PlanGroup> group_plan(const std::vector<TensorPlan>& plan) {
    std::vector<PlanGroup> groups;
    for (const auto& p : plan) {
        auto it = std::find_if(groups.begin(), groups.end(), [&](const PlanGroup& g) {
            return g.cls == p.choice.cls && g.qtype == p.choice.qtype &&
                   g.reason == p.choice.reason;
        });
        if (it == groups.end())
            it = groups.insert(groups.end(), {p.choice.cls, p.choice.qtype, p.choice.reason});
        it->tensors += 1;
    }
    return groups;
}

void resolve_method_options(QuantMethod method, const MethodChoices& choices,
                            CalibratedOptions& options) {
    const QuantMethodInfo& info = quant_method_info(method);
    const MethodDefaults& d = info.defaults;
    const bool text = !options.calibration.files.empty();
    const std::string m = "--method " + std::string(info.name);
    if (choices.importance.value_or(false) && choices.mse.value_or(false))
        throw Error(
            "--importance and --mse choose each group's grid differently: give one of them");
    const bool mse = choices.mse.value_or(false);
    options.mse = mse ? kGptqMseNorm : 0.0;
    // An explicit --mse replaces the default search; RTN weighs only when it has text to weigh by.
    options.importance =
        choices.importance.value_or(d.importance && !mse && (info.calibrated || text));
    if (options.importance && !text)
        throw Error(m + " --importance needs calibration text: --calib FILE");
    if (!info.calibrated && text && !options.importance)
        throw Error(m + " --no-importance reads no calibration text: drop --calib FILE");
    options.act_order = choices.act_order.value_or(d.act_order);
    const bool gptq = method == QuantMethod::gptq || method == QuantMethod::awq_gptq;
    if (choices.refit.value_or(false) && !gptq)
        throw Error(m + " --refit refits GPTQ's grids: use --method gptq or awq+gptq");
    options.refit = gptq && choices.refit.value_or(d.refit);
    options.damp = choices.damp.value_or(d.damp);
    options.calibration.nsamples = choices.nsamples.value_or(d.nsamples);
}

QuantizeReport quantize_model(const QuantizeOptions& options, const PlanCallback& on_plan) {
    const auto start = std::chrono::steady_clock::now();
    QuantizeReport report;
    const std::unique_ptr<ModelSource> src = open_model_source(options.input, options.tokenizer);
    report.warnings = src->warnings();
    report.tokenizer = src->tokenizer_file();

    // Every decision, and every refusal, before the first byte is written.
    std::vector<TensorPlan> plan;
    uint64_t total_bytes = 0;
    const bool tied = src->config().tie_word_embeddings;
    for (size_t i = 0; i < src->tensors().size(); ++i) {
        const SourceTensor& t = src->tensors()[i];
        TensorPlan p{t.name, t.shape, t.qtype,
                     choose_tensor_qtype(options.recipe, t.name, t.shape, t.qtype, tied)};
        if (!t.col_perm.empty())
            throw Error(src->file_of(i), t.name,
                        "has a column permutation (an act-order GPTQ import): quantize cannot "
                        "re-plan it; run the imported .qf as it is, or quantize the float model");
        if (qtype_is_quantized(t.qtype) && p.choice.qtype != t.qtype)
            throw Error(src->file_of(i), t.name,
                        "already quantized as " + std::string(qtype_traits(t.qtype).name) +
                            "; re-quantizing to " + std::string(qtype_traits(p.choice.qtype).name) +
                            " is not supported (quantize the float model instead)");
        total_bytes += qtype_tensor_bytes(t.qtype, t.shape).value_or(0);
        plan.push_back(std::move(p));
    }
    // A calibrated run reads blocks of weights together, long before it writes them: a NaN or
    // an infinity would surface as an error about a whole block (GPTQ) or an fp16 overflow (AWQ)
    // after minutes of work, so every weight it will quantize is checked first, as verify and
    // RTN name them.
    if (quant_method_info(options.recipe.method).calibrated || options.calibrated.importance) {
        std::vector<uint8_t> scratch;
        for (size_t i = 0; i < plan.size(); ++i) {
            if (!qtype_traits(plan[i].source).is_float) continue;
            QfTensorInfo info;
            info.name = plan[i].name;
            info.qtype = plan[i].source;
            info.shape = plan[i].shape;
            if (const auto bad = find_non_finite(info, src->bytes(i, scratch)))
                throw Error(src->file_of(i), plan[i].name, *bad + ": weights must be finite");
            src->release(i);
        }
    }
    ThreadPool pool(std::max(1, options.threads));
    const std::unique_ptr<CalibrationSet> calibration = calibration_set(options, *src);
    QuantRecipe recipe = options.recipe;
    QfWriter writer(options.output);
    writer.set_model(src->model_json());
    writer.set_tokenizer(src->tokenizer());
    if (options.target.set()) {
        // The header as it would be with no tensors and no plan, exactly, plus each tensor's
        // entry (about 230 bytes as the writer indents it, for SmolLM2's names) generously.
        writer.set_provenance(provenance(*src, quantization_record(recipe, {}, plan)));
        const uint64_t header = writer.size_if_finished() + plan.size() * 320;
        report.size_plan = plan_to_size(options, *src, plan, recipe, *calibration, pool, header);
    }
    report.groups = group_plan(plan);
    if (on_plan) on_plan(plan);

    auto record = [&] {
        json q = quantization_record(recipe, report.groups, plan);
        if (!report.size_plan.is_null()) q["size_plan"] = report.size_plan;
        return q;
    };
    writer.set_provenance(provenance(*src, record()));

    const std::unique_ptr<LayerSequential> engine_owner =
        make_engine(options, recipe, *src, plan, calibration.get(), pool);
    LayerSequential* engine = engine_owner.get();
    Progress progress("quantize", total_bytes);
    std::vector<uint8_t> scratch, out;
    for (size_t i = 0; i < plan.size(); ++i) {
        const TensorPlan& p = plan[i];
        const QType target = p.choice.qtype;
        const std::span<const uint8_t> in = src->bytes(i, scratch);
        QuantizedTensor r;
        r.name = p.name;
        r.cls = p.choice.cls;
        r.source = p.source;
        r.qtype = target;
        r.shape = p.shape;
        r.parameters = checked_product(p.shape).value_or(0);
        r.copied = target == p.source && qtype_is_quantized(target);  // refused above otherwise
        std::optional<std::vector<uint8_t>> calibrated;
        if (engine && !r.copied) {
            try {
                calibrated = engine->take(i);
            } catch (const Error& e) {
                // GPTQ, AWQ and the Hessian know no file: name the model and the block here
                // (taking one tensor computes its whole block).
                if (!e.file().empty()) throw;
                throw Error(src->path(), e.tensor(), "the block of " + p.name + ": " + e.detail());
            }
        }
        if (calibrated) {
            writer.add_tensor(p.name, target, p.shape, *calibrated);
            r.bytes = calibrated->size();
        } else if (r.copied) {
            writer.add_tensor(p.name, target, p.shape, in);
            r.bytes = in.size();
        } else {
            // Matrices row by row; any other shape is one row of all its elements.
            const uint64_t rows = p.shape.size() == 2 ? p.shape[0] : 1;
            const uint64_t k = p.shape.size() == 2 ? p.shape[1] : r.parameters;
            const auto size = qtype_tensor_bytes(target, p.shape);
            if (!size)
                throw Error(src->file_of(i), p.name,
                            "shape " + shape_to_string(p.shape) + " cannot be stored as " +
                                std::string(qtype_traits(target).name));
            resize_for(out, *size, src->file_of(i), p.name);
            if (auto f = rtn_quantize(p.source, in, rows, k, target, out, &pool))
                throw Error(src->file_of(i), p.name, failure_text(*f, rows, target));
            writer.add_tensor(p.name, target, p.shape, out);
            r.bytes = out.size();
        }
        src->release(i);
        progress.advance(in.size());
        report.parameters += r.parameters;
        report.tensor_bytes += r.bytes;
        report.tensors.push_back(std::move(r));
    }
    if (engine) {
        json q = record();
        q[std::string(quant_method_info(options.recipe.method).name)] = engine->record();
        writer.set_provenance(provenance(*src, q));
        report.linears = engine->linears();
    }
    if (!report.size_plan.is_null()) {
        // The promise is the whole file: refused, with nothing written, if the header outgrew
        // the allowance (quant/size_plan.hpp's record sizes are estimates).
        const uint64_t size = writer.size_if_finished(),
                       target = report.size_plan["target_bytes"].get<uint64_t>();
        if (size > target)
            throw Error(options.output, {},
                        "would take " + std::to_string(size) + " bytes, over the size target " +
                            "of " + std::to_string(target) +
                            ": the header outgrew the plan's allowance (a bug; please report it)");
    }
    writer.finish();
    progress.finish();
    report.bytes_written = writer.bytes_written();
    report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report;
}

}  // namespace qforge
