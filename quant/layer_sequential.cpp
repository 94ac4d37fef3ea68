#include "quant/layer_sequential.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <initializer_list>
#include <map>

#include "core/error.hpp"
#include "formats/json_io.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "quant/awq.hpp"
#include "quant/block_forward.hpp"
#include "quant/block_quantizer.hpp"
#include "quant/grid_refit.hpp"
#include "quant/hessian.hpp"
#include "quant/rtn.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

namespace {

std::string duration_text(double s) {
    char buf[32];
    if (s >= 60)
        std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60,
                      static_cast<int>(s) % 60);
    else
        std::snprintf(buf, sizeof buf, "%.1fs", s);
    return buf;
}

}  // namespace

struct LayerSequential::State {
    const ModelSource& src;
    std::vector<QType> qtypes;
    const CalibrationSet& calib;
    CalibratedOptions options;
    ThreadPool& pool;
    BlasSingleThread blas;  // products with fixed geometry: results independent of threads
    std::map<std::string, size_t> index;
    BlockForward f;
    BlockForward::Buffers buffers;  // the forward's activations, reused by every block
    std::vector<float> x;           // the next block's input, [tokens][hidden]
    uint64_t layers_done = 0;
    std::unique_ptr<ResumeDir> resume;  // null: no --resume
    uint64_t resumed = 0;               // blocks served from `resume` instead of computed
    std::map<size_t, std::vector<uint8_t>> ready;         // quantized tensors of the current block
    nlohmann::json awq_groups = nlohmann::json::array();  // per block: each group's alpha
    nlohmann::json awq_clips = nlohmann::json::array();   // per linear: groups clipped
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

    State(const ModelSource& s, std::vector<QType> q, const CalibrationSet& c,
          const CalibratedOptions& o, ThreadPool& p)
        : src(s),
          qtypes(std::move(q)),
          calib(c),
          options(o),
          pool(p),
          f(s.config(), c.nsamples, c.seqlen, p, o.products) {
        for (size_t i = 0; i < s.tensors().size(); ++i) index[s.tensors()[i].name] = i;
        if (const std::string notice = blas_kernels_notice(); !notice.empty())
            std::fprintf(stderr, "note: %s\n", notice.c_str());
    }

    size_t at(const std::string& name) const {
        auto it = index.find(name);
        if (it == index.end()) throw Error(src.path(), name, "tensor missing from the model");
        return it->second;
    }
};

LayerSequential::LayerSequential(const ModelSource& source, std::vector<QType> qtypes,
                                 const CalibrationSet& calibration,
                                 const CalibratedOptions& options, ThreadPool& pool,
                                 std::unique_ptr<ResumeDir> resume)
    : s_(std::make_unique<State>(source, std::move(qtypes), calibration, options, pool)) {
    // The first block's input: the embeddings of the calibration tokens.
    const ModelConfig& c = source.config();
    const size_t e = s_->at("embed");
    std::vector<uint8_t> scratch;
    const auto bytes = source.bytes(e, scratch);
    const QType et = source.tensors()[e].qtype;
    const uint64_t d = c.hidden_size, row = *qtype_row_bytes(et, d);
    s_->x.resize(calibration.tokens.size() * d);
    for (size_t t = 0; t < calibration.tokens.size(); ++t) {
        const int32_t id = calibration.tokens[t];
        if (id < 0 || static_cast<uint64_t>(id) >= c.vocab_size)
            throw Error(
                source.path(), "embed",
                "calibration token id " + std::to_string(id) + " is outside the vocabulary");
        row_to_f32(et, bytes.data() + static_cast<uint64_t>(id) * row, s_->x.data() + t * d, d);
    }

    s_->resume = std::move(resume);
    if (s_->resume && s_->resume->blocks_done() > 0) {
        // The next block's input: the hidden states saved after the last finished block.
        const uint64_t last = s_->resume->blocks_done() - 1;
        BlockState st = s_->resume->load(last, true, false);
        if (st.hidden.size() != s_->x.size())
            throw Error(s_->resume->block_path(last), {},
                        "holds " + std::to_string(st.hidden.size()) +
                            " hidden-state values, the "
                            "calibration batch needs " +
                            std::to_string(s_->x.size()));
        s_->x = std::move(st.hidden);
        s_->resumed = s_->resume->blocks_done();
        std::fprintf(stderr, "resuming from %s: blocks 0..%llu done\n", s_->resume->dir().c_str(),
                     static_cast<unsigned long long>(last));
    }
}

LayerSequential::~LayerSequential() = default;

std::optional<std::vector<uint8_t>> LayerSequential::take(size_t tensor) {
    const std::string& name = s_->src.tensors()[tensor].name;
    if (name.rfind("layers.", 0) != 0) return std::nullopt;
    const uint64_t layer = std::stoull(name.substr(7, name.find('.', 7) - 7));
    if (layer >= s_->layers_done) {
        if (layer != s_->layers_done)
            throw Error(s_->src.path(), name, "internal error: blocks must be taken in order");
        s_->ready.clear();
        if (layer < s_->resumed) {
            restore_layer(layer);
        } else {
            const size_t first_linear = linears_.size(), first_clip = s_->awq_clips.size();
            run_layer(layer);
            if (s_->resume) save_layer(layer, first_linear, first_clip);
        }
        s_->layers_done = layer + 1;
    }
    auto it = s_->ready.find(tensor);
    if (it == s_->ready.end()) return std::nullopt;
    std::vector<uint8_t> out = std::move(it->second);
    s_->ready.erase(it);
    return out;
}

namespace {

nlohmann::json linear_to_json(const LinearReport& r) {
    return {{"name", r.name},
            {"qtype", r.qtype},
            {"relative_error", r.relative_error},
            {"rtn_relative_error", r.rtn_relative_error},
            {"damp", r.damp},
            {"damp_raises", r.damp_raises}};
}

}  // namespace

// Saves the block just computed (its tensors are still all in `ready`).
void LayerSequential::save_layer(uint64_t layer, size_t first_linear, size_t first_clip) {
    State& s = *s_;
    BlockState st;
    st.layer = layer;
    nlohmann::json linears = nlohmann::json::array(), clips = nlohmann::json::array();
    for (size_t i = first_linear; i < linears_.size(); ++i)
        linears.push_back(linear_to_json(linears_[i]));
    for (size_t i = first_clip; i < s.awq_clips.size(); ++i) clips.push_back(s.awq_clips[i]);
    const bool awq =
        s.options.method == QuantMethod::awq || s.options.method == QuantMethod::awq_gptq;
    st.meta = {{"linears", linears},
               {"awq_group", awq ? s.awq_groups.back() : nlohmann::json()},
               {"awq_clips", clips}};
    st.hidden = s.x;
    st.tensors = s.ready;
    s.resume->save(st);
    // Test hook, for tests of an interrupted run: QFORGE_TEST_STOP_AFTER_BLOCK=N fails the run
    // right after block N's state is saved, as a crash there would (no output is written).
    if (const char* stop = std::getenv("QFORGE_TEST_STOP_AFTER_BLOCK");
        stop && std::to_string(layer) == stop)
        throw Error("stopped after block " + std::to_string(layer) + " (test hook)");
}

// Serves a block finished by an earlier run: its tensors and its part of record().
void LayerSequential::restore_layer(uint64_t layer) {
    State& s = *s_;
    BlockState st = s.resume->load(layer, false, true);
    const std::string path = s.resume->block_path(layer);
    const JsonView meta(st.meta, path, "meta");
    try {
        meta["linears"].for_each_element([&](const JsonView& l) {
            linears_.push_back({l["name"].string(), l["qtype"].string(),
                                l["relative_error"].number(), l["rtn_relative_error"].number(),
                                l["damp"].number(),
                                static_cast<int>(l["damp_raises"].integer(0, INT32_MAX))});
        });
        if (meta["awq_group"].is_set()) s.awq_groups.push_back(meta["awq_group"].object());
        meta["awq_clips"].for_each_element(
            [&](const JsonView& c) { s.awq_clips.push_back(c.value()); });
    } catch (const Error& e) {
        throw Error(path, {},
                    "damaged block state: " + e.detail() + " (delete it to recompute the block)");
    }
    for (auto& [i, bytes] : st.tensors) {
        const std::string* name = i < s.src.tensors().size() ? &s.src.tensors()[i].name : nullptr;
        const auto expected = name ? qtype_tensor_bytes(s.qtypes[i], s.src.tensors()[i].shape)
                                   : std::optional<uint64_t>{};
        if (!expected || *expected != bytes.size() ||
            name->rfind("layers." + std::to_string(layer) + ".", 0) != 0)
            throw Error(path, {},
                        "damaged block state: tensor " + std::to_string(i) +
                            " does not belong to block " + std::to_string(layer) +
                            " in its planned type");
        s.ready[i] = std::move(bytes);
    }
}

void LayerSequential::run_layer(uint64_t layer) {
    State& s = *s_;
    const ModelConfig& c = s.src.config();
    const auto t0 = std::chrono::steady_clock::now();
    const QuantMethod method = s.options.method;
    const bool awq = method == QuantMethod::awq || method == QuantMethod::awq_gptq;
    const size_t first_report = linears_.size();
    const BlockQuantContext ctx{s.src,   s.qtypes, s.options, s.pool,
                                s.index, s.ready,  linears_,  s.awq_clips};
    const nlohmann::json groups = BlockQuantizer(ctx, s.f, layer).run(s.x, s.buffers);
    if (awq) s.awq_groups.push_back({{"layer", layer}, {"groups", groups}});

    // One line per block: its time, the ETA, and each linear's relative output error.
    const auto now = std::chrono::steady_clock::now();
    const double took = std::chrono::duration<double>(now - t0).count();
    const double elapsed = std::chrono::duration<double>(now - s.start).count();
    const double eta =
        elapsed / static_cast<double>(layer + 1) * static_cast<double>(c.num_layers - layer - 1);
    std::string line = std::string(quant_method_info(method).name) + ": block " +
                       std::to_string(layer + 1) + "/" + std::to_string(c.num_layers) + " in " +
                       duration_text(took) + ", ETA " + duration_text(eta);
    if (awq) {
        line += "; alpha";
        for (const char* g : {"qkv", "vo", "gate_up", "down"}) {
            char buf[48];
            if (groups.contains(g) && groups[g].contains("alpha"))
                std::snprintf(buf, sizeof buf, " %s %.2f", g, groups[g]["alpha"].get<double>());
            else
                std::snprintf(buf, sizeof buf, " %s -", g);
            line += buf;
        }
    }
    line += "; relative output error (RTN):";
    for (size_t i = first_report; i < linears_.size(); ++i) {
        const auto& r = linears_[i];
        char buf[96];
        std::snprintf(buf, sizeof buf, " %s %.4f (%.4f)",
                      r.name.substr(r.name.rfind('.') + 1).c_str(), r.relative_error,
                      r.rtn_relative_error);
        line += buf;
    }
    std::fprintf(stderr, "%s%s\n", isatty(2) ? "\r\033[K" : "", line.c_str());
}

nlohmann::json LayerSequential::record() const {
    nlohmann::json linears = nlohmann::json::array();
    for (const auto& r : linears_) linears.push_back(linear_to_json(r));
    nlohmann::json r = {{"method", std::string(quant_method_info(s_->options.method).name)},
                        {"calibration", s_->calib.to_json()},
                        {"true_sequential", true},
                        {"blas_kernels", blas_kernels()},
                        {"products", std::string(calib_products_name(s_->options.products))},
                        {"linears", linears}};
    if (s_->options.importance) r["importance"] = "diag(H): mean squared activation per input";
    if (s_->options.method == QuantMethod::gptq || s_->options.method == QuantMethod::awq_gptq) {
        r["damp"] = s_->options.damp;
        r["act_order"] = s_->options.act_order;
        r["static_groups"] = s_->options.act_order;
        r["mse"] = s_->options.mse;
        r["refit_sweeps"] = s_->options.refit ? kGridRefitSweeps : 0;
        r["block"] = GptqOptions{}.block;
    }
    if (s_->options.method == QuantMethod::awq || s_->options.method == QuantMethod::awq_gptq)
        r["awq"] = {{"alpha_grid", kAwqScaleGrid},
                    {"min_scale", kAwqMinScale},
                    {"search_tokens_mlp", kAwqSearchTokens},
                    {"qkv_inspected", "q, k and v outputs concatenated, H-weighted, every token"},
                    {"clip_steps", kAwqClipSteps},
                    {"clip_grid", kAwqClipGrid},
                    {"clip_error", "H-weighted over every calibration token"},
                    {"blocks", s_->awq_groups},
                    {"clips", s_->awq_clips}};
    return r;
}

}  // namespace qforge
