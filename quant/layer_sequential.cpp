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
#include "quant/hessian.hpp"
#include "quant/rtn.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

namespace {

// Tokens per step of the MLP (bounds the gate and up activations to this many rows).
constexpr uint64_t kMlpChunk = 4096;

GptqOptions gptq_options(const CalibratedOptions& c, QType target) {
    GptqOptions o;
    o.qtype = target;
    o.damp = c.damp;
    o.act_order = c.act_order;
    o.mse = c.mse;
    return o;
}
// AWQ: tokens (a strided subsample) on which the gate/up scale search runs the MLP per alpha.
constexpr uint64_t kAwqSearchTokens = 4096;

std::vector<float> to_f32(const Matrix& w) {
    std::vector<float> out(w.rows * w.cols);
    for (uint64_t r = 0; r < w.rows; ++r)
        row_to_f32(w.qtype, w.row(r), out.data() + r * w.cols, w.cols);
    return out;
}

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
    std::vector<float> x;  // the next block's input, [tokens][hidden]
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
          f(s.config(), c.nsamples, c.seqlen, p) {
        for (size_t i = 0; i < s.tensors().size(); ++i) index[s.tensors()[i].name] = i;
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
        meta["awq_clips"].for_each_element([&](const JsonView& c) { s.awq_clips.push_back(c.value()); });
    } catch (const Error& e) {
        throw Error(path, {}, "damaged block state: " + e.detail() + " (delete it to recompute the block)");
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
    const BlockForward& f = s.f;
    const uint64_t n = f.tokens(), d = c.hidden_size, inter = c.intermediate_size;
    const uint64_t qd = c.q_dim(), kvd = c.kv_dim();
    const std::string p = "layers." + std::to_string(layer) + ".";
    const auto t0 = std::chrono::steady_clock::now();
    const QuantMethod method = s.options.method;
    const bool awq = method == QuantMethod::awq || method == QuantMethod::awq_gptq;
    const bool use_gptq = method == QuantMethod::gptq || method == QuantMethod::awq_gptq;

    std::deque<std::vector<uint8_t>> keep;  // decoded bytes of this block's float tensors
    auto matrix = [&](const std::string& suffix) {
        const size_t i = s.at(p + suffix);
        keep.emplace_back();
        const auto b = s.src.bytes(i, keep.back());
        const SourceTensor& t = s.src.tensors()[i];
        return Matrix{t.name, t.qtype, b.data(), t.shape.at(0), t.shape.at(1)};
    };
    auto vector = [&](const std::string& suffix) {
        std::vector<float> v;
        auto it = s.index.find(p + suffix);
        if (it == s.index.end()) return v;
        std::vector<uint8_t> scratch;
        const auto b = s.src.bytes(it->second, scratch);
        const SourceTensor& t = s.src.tensors()[it->second];
        v.resize(t.shape.at(0));
        dequantize_row_ref(t.qtype, b.data(), v.size(), v.data());
        return v;
    };
    auto hessian = [&](const float* in, uint64_t k) {
        HessianAccumulator acc(k, &s.pool);
        acc.add(in, n);
        return acc.finish();
    };
    auto target_of = [&](const std::string& suffix) { return s.qtypes[s.at(p + suffix)]; };
    auto float_source = [&](const std::string& suffix) {
        return !qtype_is_quantized(s.src.tensors()[s.at(p + suffix)].qtype);
    };
    // Folded float values handed to the writer in the tensor's planned (float) type.
    auto store_float = [&](const std::string& suffix, const std::vector<float>& v) {
        const size_t i = s.at(p + suffix);
        const SourceTensor& t = s.src.tensors()[i];
        const uint64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
        const uint64_t k = v.size() / rows;
        std::vector<uint8_t> out(*qtype_tensor_bytes(s.qtypes[i], t.shape));
        const std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(v.data()),
                                          v.size() * sizeof(float));
        if (rtn_quantize(QType::f32, in, rows, k, s.qtypes[i], out, &s.pool))
            throw Error(s.src.path(), t.name, "a folded AWQ value does not fit its type");
        s.ready[i] = std::move(out);
    };

    // The block's float weights; AWQ folds its scales into them.
    AwqBlock b;
    b.attn_norm = vector("attn_norm");
    b.mlp_norm = vector("mlp_norm");
    b.v_bias = vector("attn.v_bias");
    b.q = to_f32(matrix("attn.q"));
    b.k = to_f32(matrix("attn.k"));
    b.v = to_f32(matrix("attn.v"));
    b.o = to_f32(matrix("attn.o"));
    b.gate = to_f32(matrix("mlp.gate"));
    b.up = to_f32(matrix("mlp.up"));
    b.down = to_f32(matrix("mlp.down"));
    keep.clear();
    const std::vector<float> qb = vector("attn.q_bias"), kb = vector("attn.k_bias");

    // Quantizes one linear whose (folded) float weights are w, with h_s the H of the inputs
    // they see and s_in the AWQ scales folded into their columns (empty: none); returns the
    // weights the rest of the block runs with (the quantized ones, dequantized to f32).
    const size_t first_report = linears_.size();
    auto quantize = [&](const std::string& suffix, const std::vector<float>& w,
                        const std::vector<double>& h_s, const std::vector<float>& s_in, bool clip) {
        const size_t i = s.at(p + suffix);
        const SourceTensor& t = s.src.tensors()[i];
        const uint64_t rows = t.shape.at(0), k = t.shape.at(1);
        const QType target = s.qtypes[i];
        if (qtype_is_quantized(t.qtype)) return w;  // already quantized: copied as is
        if (!qtype_is_quantized(target)) {
            if (awq) store_float(suffix, w);  // folded weights in a float type
            return w;
        }
        if (!awq) {
            GptqResult r = gptq_quantize(w.data(), rows, k, h_s, gptq_options(s.options, target),
                                         &s.pool);
            const double norm = std::max(r.weight_output_norm, 1e-300);
            linears_.push_back({t.name, std::string(qtype_traits(target).name),
                                std::sqrt(r.output_error / norm),
                                std::sqrt(r.rtn_output_error / norm), r.damp_used, r.damp_raises});
            std::vector<float> qf = to_f32(Matrix{t.name, target, r.packed.data(), rows, k});
            s.ready[i] = std::move(r.packed);
            return qf;
        }
        // AWQ: clipping search on the scaled weights, then RTN or GPTQ.
        std::vector<float> wc = w;
        AwqClipStats clipped;
        if (clip) clipped = awq_clip(target, wc.data(), rows, k, h_s, &s.pool);
        LinearReport rep{t.name, std::string(qtype_traits(target).name), 0, 0, 0, 0};
        std::vector<uint8_t> packed(*qtype_tensor_bytes(target, t.shape));
        if (use_gptq) {
            GptqOptions o = gptq_options(s.options, target);
            o.measure = false;
            GptqResult r = gptq_quantize(wc.data(), rows, k, h_s, o, &s.pool);
            packed = std::move(r.packed);
            rep.damp = r.damp_used;
            rep.damp_raises = r.damp_raises;
        } else {
            const std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(wc.data()),
                                              wc.size() * sizeof(float));
            if (rtn_quantize(QType::f32, in, rows, k, target, packed, &s.pool))
                throw Error(s.src.path(), t.name, "a scaled AWQ group overflows fp16");
        }
        std::vector<float> qf = to_f32(Matrix{t.name, target, packed.data(), rows, k});
        // Errors against the folded float weights on the inputs they see; RTN's on the same
        // inputs without this linear's own input scales and clipping (the output rows of v
        // and up stay divided by the v -> o and down scales: the same output coordinates).
        const std::vector<float> zero(rows * k, 0.0f);
        const double norm =
            std::max(awq_hessian_error(w.data(), zero.data(), rows, k, h_s), 1e-300);
        rep.relative_error = std::sqrt(awq_hessian_error(w.data(), qf.data(), rows, k, h_s) / norm);
        std::vector<float> w_in = w, q_rtn(rows * k);
        std::vector<double> h_in = h_s;
        if (!s_in.empty()) {
            std::vector<float> inv(k);
            for (uint64_t j = 0; j < k; ++j) inv[j] = 1.0f / s_in[j];
            for (uint64_t e = 0; e < rows * k; ++e) w_in[e] /= s_in[e % k];
            h_in = awq_scale_hessian(h_s, inv);
        }
        awq_fake_quantize(target, w_in.data(), rows, k, nullptr, q_rtn.data(), &s.pool);
        rep.rtn_relative_error =
            std::sqrt(awq_hessian_error(w_in.data(), q_rtn.data(), rows, k, h_in) / norm);
        linears_.push_back(rep);
        s.awq_clips.push_back(
            {{"name", t.name}, {"groups", clipped.groups}, {"clipped", clipped.clipped}});
        s.ready[i] = std::move(packed);
        return qf;
    };

    // One AWQ scale search; `what` names the group in the record.
    nlohmann::json groups = nlohmann::json::object();
    auto search = [&](const char* what, const std::vector<double>& x_mean,
                      const std::vector<AwqLinear>& linears, uint64_t k,
                      const AwqEvaluate& evaluate) {
        const AwqScaleSearch r =
            awq_search_scales(x_mean, linears, k, evaluate, kAwqScaleGrid, &s.pool);
        groups[what] = {{"alpha", r.alpha}, {"error", r.error()}, {"rtn_error", r.rtn_error()}};
        return r.best == 0 ? std::vector<float>{} : r.scales;  // alpha 0: s = 1, nothing to fold
    };
    auto skip = [&](const char* what, const std::string& why) {
        groups[what] = {{"skipped", why}};
    };
    auto all_float = [&](std::initializer_list<const char*> names) {
        for (const char* nm : names)
            if (!float_source(nm)) return false;
        return true;
    };
    auto add_bias = [n](std::vector<float>& y, const std::vector<float>& bias) {
        if (bias.empty()) return;
        for (uint64_t t = 0; t < n; ++t)
            for (size_t r = 0; r < bias.size(); ++r) y[t * bias.size() + r] += bias[r];
    };
    auto attention = [&](const std::vector<float>& h, const float* wq, const float* wk,
                         const float* wv, const std::vector<float>& vb, float* out) {
        std::vector<float> q(n * qd), k(n * kvd), v(n * kvd);
        f.linear_f32(wq, qd, d, h.data(), n, q.data());
        f.linear_f32(wk, kvd, d, h.data(), n, k.data());
        f.linear_f32(wv, kvd, d, h.data(), n, v.data());
        add_bias(q, qb);
        add_bias(k, kb);
        add_bias(v, vb);
        f.attention(q.data(), k.data(), v.data(), out);
    };
    auto mlp = [&](const std::vector<float>& h, const float* wg, const float* wu, uint64_t tokens,
                   float* m) {
        std::vector<float> g(std::min(kMlpChunk, tokens) * inter), u(g.size());
        for (uint64_t t0c = 0; t0c < tokens; t0c += kMlpChunk) {
            const uint64_t nt = std::min(kMlpChunk, tokens - t0c);
            f.linear_f32(wg, inter, d, h.data() + t0c * d, nt, g.data());
            f.linear_f32(wu, inter, d, h.data() + t0c * d, nt, u.data());
            f.swiglu(g.data(), u.data(), m + t0c * inter, nt * inter);
        }
    };
    const bool vo_pair = awq_scales_v_to_o(c);

    // Attention: q, k, v from one normalized input; o from the attention output.
    std::vector<float> h(n * d);
    f.rms_norm(s.x.data(), b.attn_norm, h.data());
    HessianStats hs = hessian(h.data(), d);
    AwqBlockScales sc;
    if (awq) {
        // q/k/v: the inspected output is q, k and v concatenated (the exact H-weighted error over
        // every calibration token; AutoAWQ inspects the attention output instead, which needs a
        // softmax per candidate over whole sequences).
        if (all_float({"attn.q", "attn.k", "attn.v"}))
            sc.qkv = search("qkv", hs.mean_abs,
                            {{b.q.data(), qd, target_of("attn.q")},
                             {b.k.data(), kvd, target_of("attn.k")},
                             {b.v.data(), kvd, target_of("attn.v")}},
                            d, [&](const std::vector<std::vector<float>>& cand) {
                                return awq_hessian_error(b.q.data(), cand[0].data(), qd, d, hs.h) +
                                       awq_hessian_error(b.k.data(), cand[1].data(), kvd, d, hs.h) +
                                       awq_hessian_error(b.v.data(), cand[2].data(), kvd, d, hs.h);
                            });
        else
            skip("qkv", "a source matrix is already quantized");
        if (!vo_pair)
            skip("vo",
                 "num_kv_heads < num_heads: v_proj and o_proj differ in shape (AutoAWQ skips)");
        else if (!all_float({"attn.v", "attn.o"}))
            skip("vo", "a source matrix is already quantized");
        else {
            std::vector<float> af(n * qd);
            attention(h, b.q.data(), b.k.data(), b.v.data(), b.v_bias, af.data());
            const HessianStats ha = hessian(af.data(), qd);
            sc.vo = search("vo", ha.mean_abs, {{b.o.data(), d, target_of("attn.o")}}, qd,
                           [&](const std::vector<std::vector<float>>& cand) {
                               return awq_hessian_error(b.o.data(), cand[0].data(), d, qd, ha.h);
                           });
        }
        awq_fold(c, b, sc);
        if (!sc.qkv.empty()) {
            store_float("attn_norm", b.attn_norm);
            f.rms_norm(s.x.data(), b.attn_norm, h.data());
            hs = hessian(h.data(), d);
        }
        if (!sc.vo.empty() && !b.v_bias.empty()) store_float("attn.v_bias", b.v_bias);
    }
    std::vector<float> a(n * qd);
    {
        const std::vector<float> wq = quantize("attn.q", b.q, hs.h, sc.qkv, false),
                                 wk = quantize("attn.k", b.k, hs.h, sc.qkv, false),
                                 wv = quantize("attn.v", b.v, hs.h, sc.qkv, true);
        attention(h, wq.data(), wk.data(), wv.data(), b.v_bias, a.data());
    }
    hs = {};
    {
        const std::vector<float> wo = quantize("attn.o", b.o, hessian(a.data(), qd).h, sc.vo, true);
        f.linear_f32(wo.data(), d, qd, a.data(), n, h.data());
        for (uint64_t i = 0; i < n * d; ++i) s.x[i] += h[i];
    }
    a = {};

    // MLP: gate and up from one normalized input; down from their product.
    f.rms_norm(s.x.data(), b.mlp_norm, h.data());
    HessianStats hs2 = hessian(h.data(), d);
    std::vector<float> m(n * inter);
    if (awq) {
        if (!all_float({"mlp.gate", "mlp.up", "mlp.down"})) {
            skip("gate_up", "a source matrix is already quantized");
            skip("down", "a source matrix is already quantized");
        } else {
            // gate/up: the inspected output is the MLP's (down in float), on a strided subsample
            // of at most kAwqSearchTokens tokens.
            const uint64_t ns = std::min(n, kAwqSearchTokens);
            std::vector<float> xs(ns * d);
            for (uint64_t t = 0; t < ns; ++t) {
                const uint64_t src = t * n / ns;
                std::copy(h.begin() + static_cast<std::ptrdiff_t>(src * d),
                          h.begin() + static_cast<std::ptrdiff_t>((src + 1) * d),
                          xs.begin() + static_cast<std::ptrdiff_t>(t * d));
            }
            std::vector<float> ms(ns * inter), yref(ns * d), y(ns * d);
            mlp(xs, b.gate.data(), b.up.data(), ns, ms.data());
            f.linear_f32(b.down.data(), d, inter, ms.data(), ns, yref.data());
            sc.gate_up = search("gate_up", hs2.mean_abs,
                                {{b.gate.data(), inter, target_of("mlp.gate")},
                                 {b.up.data(), inter, target_of("mlp.up")}},
                                d, [&](const std::vector<std::vector<float>>& cand) {
                                    mlp(xs, cand[0].data(), cand[1].data(), ns, ms.data());
                                    f.linear_f32(b.down.data(), d, inter, ms.data(), ns, y.data());
                                    double e = 0.0;
                                    for (uint64_t i = 0; i < y.size(); ++i) {
                                        const double diff = double(y[i]) - yref[i];
                                        e += diff * diff;
                                    }
                                    return e;
                                });
            // down: its own output on every token, through the H of the float MLP activation.
            mlp(h, b.gate.data(), b.up.data(), n, m.data());
            const HessianStats hm = hessian(m.data(), inter);
            sc.down =
                search("down", hm.mean_abs, {{b.down.data(), d, target_of("mlp.down")}}, inter,
                       [&](const std::vector<std::vector<float>>& cand) {
                           return awq_hessian_error(b.down.data(), cand[0].data(), d, inter, hm.h);
                       });
        }
        AwqBlockScales mlp_scales;
        mlp_scales.gate_up = sc.gate_up;
        mlp_scales.down = sc.down;
        awq_fold(c, b, mlp_scales);
        if (!sc.gate_up.empty()) {
            store_float("mlp_norm", b.mlp_norm);
            f.rms_norm(s.x.data(), b.mlp_norm, h.data());
            hs2 = hessian(h.data(), d);
        }
    }
    {
        const std::vector<float> wg = quantize("mlp.gate", b.gate, hs2.h, sc.gate_up, true),
                                 wu = quantize("mlp.up", b.up, hs2.h, sc.gate_up, true);
        mlp(h, wg.data(), wu.data(), n, m.data());
    }
    hs2 = {};
    {
        const std::vector<float> wd =
            quantize("mlp.down", b.down, hessian(m.data(), inter).h, sc.down, true);
        f.linear_f32(wd.data(), d, inter, m.data(), n, h.data());
        for (uint64_t i = 0; i < n * d; ++i) s.x[i] += h[i];
    }
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
                        {"linears", linears}};
    if (s_->options.method != QuantMethod::awq) {
        r["damp"] = s_->options.damp;
        r["act_order"] = s_->options.act_order;
        r["static_groups"] = s_->options.act_order;
        r["mse"] = s_->options.mse;
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
