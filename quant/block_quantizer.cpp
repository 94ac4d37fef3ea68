#include "quant/block_quantizer.hpp"

#include <algorithm>
#include <cmath>
#include <deque>

#include "core/error.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "quant/grid_refit.hpp"
#include "quant/rtn.hpp"
#include "quant/rtn_importance.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

namespace {

const char* suffix_of(Weight w) {
    static const char* const names[kBlockLinears] = {"attn.q",   "attn.k", "attn.v",  "attn.o",
                                                     "mlp.gate", "mlp.up", "mlp.down"};
    return names[static_cast<size_t>(w)];
}

std::vector<float>& float_weights(AwqBlock& b, Weight w) {
    std::vector<float>* m[kBlockLinears] = {&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down};
    return *m[static_cast<size_t>(w)];
}

std::vector<float> to_f32(const Matrix& w, ThreadPool& pool) {
    std::vector<float> out(w.rows * w.cols);
    pool.parallel_for(w.rows, [&](size_t b, size_t e) {
        for (uint64_t r = b; r < e; ++r)
            row_to_f32(w.qtype, w.row(r), out.data() + r * w.cols, w.cols);
    });
    return out;
}

GptqOptions gptq_options(const CalibratedOptions& c, QType target) {
    GptqOptions o;
    o.measure_f32 = true;  // the report's RTN comparison (LinearReport: four digits)
    o.qtype = target;
    o.damp = c.damp;
    o.act_order = c.act_order;
    o.mse = c.mse;
    o.importance = c.importance;
    o.refit = c.refit ? kGridRefitSweeps : 0;
    return o;
}

// The diagonal of a k x k row-major matrix: each input column's importance.
std::vector<double> diagonal(const std::vector<double>& h, uint64_t k) {
    std::vector<double> d(k);
    for (uint64_t c = 0; c < k; ++c) d[c] = h[c * k + c];
    return d;
}

// H as float32, for the scale searches' float32 errors (awq_hessian_error_f32).
std::vector<float> as_float(const std::vector<double>& h) { return {h.begin(), h.end()}; }

// The statistics of a norm's output after its weights were divided by the AWQ scales s (none:
// unchanged): the inputs are x diag(1/s), so H[i][j] / (s_i s_j) and mean |x_c| / s_c, in place
// of another pass over the calibration batch (equal but for the bf16 rounding of the inputs).
HessianStats folded(HessianStats hs, const std::vector<float>& s) {
    if (s.empty()) return hs;
    hs.h = awq_scale_hessian(hs.h, s);
    for (uint64_t c = 0; c < hs.mean_abs.size(); ++c) hs.mean_abs[c] /= s[c];
    return hs;
}

// Runs the calibration forward without the hook (searches evaluate the float block).
class HookOff {
  public:
    explicit HookOff(BlockForward& f) : f_(f), hook_(f.hook) { f.hook = nullptr; }
    ~HookOff() { f_.hook = hook_; }
    HookOff(const HookOff&) = delete;
    HookOff& operator=(const HookOff&) = delete;

  private:
    BlockForward& f_;
    ProductHook* hook_;
};

}  // namespace

BlockQuantizer::BlockQuantizer(const BlockQuantContext& ctx, BlockForward& f, uint64_t layer)
    : ctx_(ctx),
      f_(f),
      c_(f.config()),
      layer_(layer),
      prefix_("layers." + std::to_string(layer) + "."),
      awq_(ctx.options.method == QuantMethod::awq || ctx.options.method == QuantMethod::awq_gptq),
      use_gptq_(ctx.options.method == QuantMethod::gptq ||
                ctx.options.method == QuantMethod::awq_gptq) {}

size_t BlockQuantizer::at(const std::string& suffix) const {
    auto it = ctx_.index.find(prefix_ + suffix);
    if (it == ctx_.index.end())
        throw Error(ctx_.src.path(), prefix_ + suffix, "tensor missing from the model");
    return it->second;
}

size_t BlockQuantizer::at(Weight w) const { return at(suffix_of(w)); }

bool BlockQuantizer::float_source(Weight w) const {
    return !qtype_is_quantized(ctx_.src.tensors()[at(w)].qtype);
}

bool BlockQuantizer::all_float(std::initializer_list<Weight> ws) const {
    return std::all_of(ws.begin(), ws.end(), [&](Weight w) { return float_source(w); });
}

std::vector<float> BlockQuantizer::load_vector(const std::string& suffix) const {
    std::vector<float> v;
    auto it = ctx_.index.find(prefix_ + suffix);
    if (it == ctx_.index.end()) return v;
    std::vector<uint8_t> scratch;
    const auto bytes = ctx_.src.bytes(it->second, scratch);
    const SourceTensor& t = ctx_.src.tensors()[it->second];
    v.resize(t.shape.at(0));
    dequantize_row_ref(t.qtype, bytes.data(), v.size(), v.data());
    return v;
}

void BlockQuantizer::load_block() {
    b_.attn_norm = load_vector("attn_norm");
    b_.mlp_norm = load_vector("mlp_norm");
    b_.v_bias = load_vector("attn.v_bias");
    q_bias_ = load_vector("attn.q_bias");
    k_bias_ = load_vector("attn.k_bias");
    q_norm_ = load_vector("attn.q_norm");  // empty unless the architecture has QK-norm
    k_norm_ = load_vector("attn.k_norm");
    attn_post_norm_ = load_vector("attn_post_norm");  // empty unless sandwich norms (Gemma)
    mlp_post_norm_ = load_vector("mlp_post_norm");
    for (int i = 0; i < kBlockLinears; ++i) {
        const size_t t = at(Weight(i));
        std::vector<uint8_t> scratch;
        const auto bytes = ctx_.src.bytes(t, scratch);
        const SourceTensor& s = ctx_.src.tensors()[t];
        float_weights(b_, Weight(i)) =
            to_f32(Matrix{s.name, s.qtype, bytes.data(), s.shape.at(0), s.shape.at(1)}, ctx_.pool);
    }
}

// The view: each linear's quantized weights once it has them, else the (folded) float ones.
void BlockQuantizer::set_view() {
    BlockView v;
    for (int i = 0; i < kBlockLinears; ++i) {
        const SourceTensor& t = ctx_.src.tensors()[at(Weight(i))];
        const std::vector<float>& q = quantized_[static_cast<size_t>(i)];
        v.linear[static_cast<size_t>(i)] = f32_matrix(
            t.name, q.empty() ? float_weights(b_, Weight(i)) : q, t.shape.at(0), t.shape.at(1));
    }
    v.norm = {&b_.attn_norm, &b_.mlp_norm,     nullptr,        &q_norm_,
              &k_norm_,      &attn_post_norm_, &mlp_post_norm_};
    v.qkv_bias = {&q_bias_, &k_bias_, &b_.v_bias};
    f_.view = std::move(v);
}

HessianStats BlockQuantizer::hessian(Rows in, uint64_t k, uint64_t n, bool mean_abs) const {
    HessianAccumulator acc(k, &ctx_.pool, ctx_.options.products, mean_abs);
    acc.add(in.data, n);
    return acc.finish();
}

// Folded float values handed to the writer in the tensor's planned (float) type.
void BlockQuantizer::store_float(const std::string& suffix, const std::vector<float>& v) {
    const size_t i = at(suffix);
    const SourceTensor& t = ctx_.src.tensors()[i];
    const uint64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
    const uint64_t k = v.size() / rows;
    std::vector<uint8_t> out(*qtype_tensor_bytes(ctx_.qtypes[i], t.shape));
    const std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(v.data()),
                                      v.size() * sizeof(float));
    if (rtn_quantize(QType::f32, in, rows, k, ctx_.qtypes[i], out, &ctx_.pool))
        throw Error(ctx_.src.path(), t.name, "a folded AWQ value does not fit its type");
    ctx_.ready[i] = std::move(out);
}

// Quantizes one linear whose (folded) float weights are in b_, with h the H of the inputs it
// sees and s_in the AWQ scales folded into its columns (empty: none); the block then runs with
// the quantized weights (dequantized to f32).
void BlockQuantizer::quantize(Weight w, const std::vector<double>& h,
                              const std::vector<float>& s_in, bool clip) {
    const size_t i = at(w);
    const SourceTensor& t = ctx_.src.tensors()[i];
    const uint64_t rows = t.shape.at(0), k = t.shape.at(1);
    const QType target = ctx_.qtypes[i];
    const std::vector<float>& wf = float_weights(b_, w);
    if (qtype_is_quantized(t.qtype)) return;  // already quantized: copied as is
    if (!qtype_is_quantized(target)) {
        if (awq_) store_float(suffix_of(w), wf);  // folded weights in a float type
        return;
    }
    if (awq_) {
        quantize_awq(w, wf, h, s_in, clip);
        return;
    }
    if (!use_gptq_) {  // importance-weighted RTN
        quantize_rtn(w, wf, h);
        return;
    }
    GptqResult r =
        gptq_quantize(wf.data(), rows, k, h, gptq_options(ctx_.options, target), &ctx_.pool);
    const double norm = std::max(r.weight_output_norm, 1e-300);
    ctx_.linears.push_back({t.name, std::string(qtype_traits(target).name),
                            std::sqrt(r.output_error / norm), std::sqrt(r.rtn_output_error / norm),
                            r.damp_used, r.damp_raises});
    quantized_[static_cast<size_t>(w)] =
        to_f32(Matrix{t.name, target, r.packed.data(), rows, k}, ctx_.pool);
    ctx_.ready[i] = std::move(r.packed);
}

// Importance-weighted RTN: each group's grid weighted by diag(h); reported against plain RTN on
// the same inputs.
void BlockQuantizer::quantize_rtn(Weight w, const std::vector<float>& wf,
                                  const std::vector<double>& h) {
    const size_t i = at(w);
    const SourceTensor& t = ctx_.src.tensors()[i];
    const uint64_t rows = t.shape.at(0), k = t.shape.at(1);
    const QType target = ctx_.qtypes[i];
    const std::vector<double> a = diagonal(h, k);
    std::vector<uint8_t> packed(*qtype_tensor_bytes(target, t.shape)), plain(packed.size());
    const std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(wf.data()),
                                      wf.size() * sizeof(float));
    if (rtn_quantize(QType::f32, in, rows, k, target, packed, &ctx_.pool, a.data()) ||
        rtn_quantize(QType::f32, in, rows, k, target, plain, &ctx_.pool))
        throw Error(ctx_.src.path(), t.name, "a group's scale overflows fp16");
    const std::vector<float> zero(rows * k, 0.0f);
    const double norm =
        std::max(awq_hessian_error(wf.data(), zero.data(), rows, k, h, &ctx_.pool), 1e-300);
    auto relative = [&](const std::vector<uint8_t>& p) {
        const std::vector<float> q = to_f32(Matrix{t.name, target, p.data(), rows, k}, ctx_.pool);
        return std::sqrt(awq_hessian_error(wf.data(), q.data(), rows, k, h, &ctx_.pool) / norm);
    };
    ctx_.linears.push_back({t.name, std::string(qtype_traits(target).name), relative(packed),
                            relative(plain), 0.0, 0});
    quantized_[static_cast<size_t>(w)] =
        to_f32(Matrix{t.name, target, packed.data(), rows, k}, ctx_.pool);
    ctx_.ready[i] = std::move(packed);
}

// AWQ: clipping search on the scaled weights, then RTN or GPTQ.
void BlockQuantizer::quantize_awq(Weight w, const std::vector<float>& wf,
                                  const std::vector<double>& h, const std::vector<float>& s_in,
                                  bool clip) {
    const size_t i = at(w);
    const SourceTensor& t = ctx_.src.tensors()[i];
    const uint64_t rows = t.shape.at(0), k = t.shape.at(1);
    const QType target = ctx_.qtypes[i];
    std::vector<float> wc = wf;
    AwqClipStats clipped;
    if (clip) clipped = awq_clip(target, wc.data(), rows, k, h, &ctx_.pool);
    LinearReport rep{t.name, std::string(qtype_traits(target).name), 0, 0, 0, 0};
    std::vector<uint8_t> packed(*qtype_tensor_bytes(target, t.shape));
    if (use_gptq_) {
        GptqOptions o = gptq_options(ctx_.options, target);
        o.measure = false;
        GptqResult r = gptq_quantize(wc.data(), rows, k, h, o, &ctx_.pool);
        packed = std::move(r.packed);
        rep.damp = r.damp_used;
        rep.damp_raises = r.damp_raises;
    } else {
        const std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(wc.data()),
                                          wc.size() * sizeof(float));
        const std::vector<double> a =
            ctx_.options.importance ? diagonal(h, k) : std::vector<double>{};
        if (rtn_quantize(QType::f32, in, rows, k, target, packed, &ctx_.pool,
                         a.empty() ? nullptr : a.data()))
            throw Error(ctx_.src.path(), t.name, "a scaled AWQ group overflows fp16");
    }
    std::vector<float> qf = to_f32(Matrix{t.name, target, packed.data(), rows, k}, ctx_.pool);
    // Errors against the folded float weights on the inputs they see; RTN's on the same inputs
    // without this linear's own input scales and clipping (the output rows of v and up stay
    // divided by the v -> o and down scales: the same output coordinates).
    const std::vector<float> zero(rows * k, 0.0f);
    const double norm =
        std::max(awq_hessian_error(wf.data(), zero.data(), rows, k, h, &ctx_.pool), 1e-300);
    rep.relative_error =
        std::sqrt(awq_hessian_error(wf.data(), qf.data(), rows, k, h, &ctx_.pool) / norm);
    std::vector<float> w_in = wf, q_rtn(rows * k);
    std::vector<double> h_in = h;
    if (!s_in.empty()) {
        std::vector<float> inv(k);
        for (uint64_t j = 0; j < k; ++j) inv[j] = 1.0f / s_in[j];
        for (uint64_t e = 0; e < rows * k; ++e) w_in[e] /= s_in[e % k];
        h_in = awq_scale_hessian(h, inv);
    }
    awq_fake_quantize(target, w_in.data(), rows, k, nullptr, q_rtn.data(), &ctx_.pool);
    rep.rtn_relative_error =
        std::sqrt(awq_hessian_error(w_in.data(), q_rtn.data(), rows, k, h_in, &ctx_.pool) / norm);
    ctx_.linears.push_back(rep);
    ctx_.awq_clips.push_back(
        {{"name", t.name}, {"groups", clipped.groups}, {"clipped", clipped.clipped}});
    quantized_[static_cast<size_t>(w)] = std::move(qf);
    ctx_.ready[i] = std::move(packed);
}

// One AWQ scale search; `what` names the group in the record.
std::vector<float> BlockQuantizer::search(const char* what, const std::vector<double>& x_mean,
                                          const std::vector<AwqLinear>& linears, uint64_t k,
                                          const AwqEvaluate& evaluate) {
    const AwqScaleSearch r =
        awq_search_scales(x_mean, linears, k, evaluate, kAwqScaleGrid, &ctx_.pool);
    groups_[what] = {{"alpha", r.alpha}, {"error", r.error()}, {"rtn_error", r.rtn_error()}};
    return r.best == 0 ? std::vector<float>{} : r.scales;  // alpha 0: s = 1, nothing to fold
}

nlohmann::json BlockQuantizer::run(std::vector<float>& x, BlockForward::Buffers& buffers) {
    load_block();
    set_view();
    a_ = f_.activations(x.data(), buffers);
    f_.hook = this;
    try {
        run_block(f_, f_.desc(), layer_, a_, f_.tokens());
    } catch (...) {
        f_.hook = nullptr;
        throw;
    }
    f_.hook = nullptr;
    return awq_ ? groups_ : nlohmann::json();
}

void BlockQuantizer::before_norm(Norm which, Rows in, uint64_t n) {
    // The q/k norms come after the products AWQ scales: nothing to search there.
    if (!awq_ || (which != Norm::attn && which != Norm::mlp)) return;
    HookOff off(f_);
    if (which == Norm::attn) search_attention(in, n);
    if (which == Norm::mlp) search_mlp(in, n);
    set_view();
}

void BlockQuantizer::before_products(Weight first, Rows in, uint64_t n) {
    auto h_of = [&](uint64_t k) {
        if (have_searched_) {
            have_searched_ = false;
            return std::move(searched_);
        }
        return hessian(in, k, n);
    };
    const uint64_t d = c_.hidden_size;
    switch (first) {
        case Weight::q: {
            const HessianStats hs = h_of(d);
            quantize(Weight::q, hs.h, scales_.qkv, false);
            quantize(Weight::k, hs.h, scales_.qkv, false);
            quantize(Weight::v, hs.h, scales_.qkv, true);
            break;
        }
        case Weight::o:
            quantize(Weight::o, hessian(in, c_.q_dim(), n).h, scales_.vo, true);
            break;
        case Weight::gate: {
            const HessianStats hs = h_of(d);
            quantize(Weight::gate, hs.h, scales_.gate_up, true);
            quantize(Weight::up, hs.h, scales_.gate_up, true);
            break;
        }
        case Weight::down:
            quantize(Weight::down, hessian(in, c_.intermediate_size, n).h, scales_.down, true);
            break;
        default:
            throw Error(ctx_.src.path(), prefix_ + suffix_of(first),
                        "calibration: no quantizer for this product group");
    }
    set_view();
}

// AWQ before the attention norm: q/k/v (inspected: their outputs concatenated, the exact
// H-weighted error over every calibration token; AutoAWQ inspects the attention output
// instead, which needs a softmax per candidate over whole sequences) and v -> o (inspected: o's
// output), on the float block; then the fold.
void BlockQuantizer::search_attention(Rows x, uint64_t n) {
    const uint64_t d = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim();
    f_.norm(layer_, Norm::attn, x, a_.h, n);
    HessianStats hs = hessian(a_.h, d, n, true);
    auto target = [&](Weight w) { return ctx_.qtypes[at(w)]; };
    if (all_float({Weight::q, Weight::k, Weight::v}))
        scales_.qkv = search(
            "qkv", hs.mean_abs,
            {{b_.q.data(), qd, target(Weight::q)},
             {b_.k.data(), kvd, target(Weight::k)},
             {b_.v.data(), kvd, target(Weight::v)}},
            d, [&, hf = as_float(hs.h)](const std::vector<std::vector<float>>& cand) {
                return awq_hessian_error_f32(b_.q.data(), cand[0].data(), qd, d, hf, &ctx_.pool) +
                       awq_hessian_error_f32(b_.k.data(), cand[1].data(), kvd, d, hf, &ctx_.pool) +
                       awq_hessian_error_f32(b_.v.data(), cand[2].data(), kvd, d, hf, &ctx_.pool);
            });
    else
        groups_["qkv"] = {{"skipped", "a source matrix is already quantized"}};
    if (!awq_scales_v_to_o(c_)) {
        groups_["vo"] = {
            {"skipped",
             "num_kv_heads < num_heads: v_proj and o_proj differ in shape (AutoAWQ skips)"}};
    } else if (!all_float({Weight::v, Weight::o})) {
        groups_["vo"] = {{"skipped", "a source matrix is already quantized"}};
    } else {
        std::vector<float> q(n * qd), k(n * kvd), v(n * kvd), att(n * qd);
        BlockActivations t = a_;
        t.q = {q.data(), qd};
        t.k = {k.data(), kvd};
        t.v = {v.data(), kvd};
        t.att = {att.data(), qd};
        block_attend(f_, f_.desc(), layer_, a_.h, t, n);
        const HessianStats ha = hessian(t.att, qd, n, true);
        scales_.vo = search("vo", ha.mean_abs, {{b_.o.data(), d, target(Weight::o)}}, qd,
                            [&, hf = as_float(ha.h)](const std::vector<std::vector<float>>& cand) {
                                return awq_hessian_error_f32(b_.o.data(), cand[0].data(), d, qd, hf,
                                                             &ctx_.pool);
                            });
    }
    awq_fold(c_, b_, scales_);
    if (!scales_.qkv.empty()) store_float("attn_norm", b_.attn_norm);  // q/k/v's input changes
    searched_ = folded(std::move(hs), scales_.qkv);
    have_searched_ = true;
    if (!scales_.vo.empty() && !b_.v_bias.empty()) store_float("attn.v_bias", b_.v_bias);
}

// AWQ before the MLP norm: gate/up (inspected: the MLP's output, down in float, on a strided
// subsample of at most kAwqSearchTokens tokens) and down (inspected: its output on every token,
// through the H of the float MLP activation); then the fold. (down's search on the subsample's
// H instead took a fifth less time on SmolLM2-135M, but its KL divergence rose 1.4% and 5% on two
// calibration seeds: not kept.)
void BlockQuantizer::search_mlp(Rows x, uint64_t n) {
    const uint64_t d = c_.hidden_size, inter = c_.intermediate_size;
    f_.norm(layer_, Norm::mlp, x, a_.h, n);
    HessianStats hs = hessian(a_.h, d, n, true);
    AwqBlockScales mlp;
    if (!all_float({Weight::gate, Weight::up, Weight::down})) {
        groups_["gate_up"] = {{"skipped", "a source matrix is already quantized"}};
        groups_["down"] = {{"skipped", "a source matrix is already quantized"}};
    } else {
        auto target = [&](Weight w) { return ctx_.qtypes[at(w)]; };
        const uint64_t ns = std::min(n, kAwqSearchTokens);
        std::vector<float> xs(ns * d);
        for (uint64_t t = 0; t < ns; ++t) {
            const float* src = a_.h.data + (t * n / ns) * d;
            std::copy(src, src + d, xs.begin() + static_cast<std::ptrdiff_t>(t * d));
        }
        std::vector<float> ms(ns * inter), yref(ns * d), y(ns * d);
        BlockActivations sub = a_;
        sub.mlp = {ms.data(), inter};
        block_mlp(f_, f_.desc(), layer_, {xs.data(), d}, {yref.data(), d}, false, sub, ns);
        const BlockView float_view = f_.view;
        mlp.gate_up = search(
            "gate_up", hs.mean_abs,
            {{b_.gate.data(), inter, target(Weight::gate)},
             {b_.up.data(), inter, target(Weight::up)}},
            d, [&](const std::vector<std::vector<float>>& cand) {
                f_.view[Weight::gate] = f32_matrix("gate candidate", cand[0], inter, d);
                f_.view[Weight::up] = f32_matrix("up candidate", cand[1], inter, d);
                block_mlp(f_, f_.desc(), layer_, {xs.data(), d}, {y.data(), d}, false, sub, ns);
                f_.view = float_view;
                double e = 0.0;
                for (uint64_t i = 0; i < y.size(); ++i) {
                    const double diff = double(y[i]) - yref[i];
                    e += diff * diff;
                }
                return e;
            });
        f_.gated_products(layer_, a_.h, f_.desc().activation, a_.mlp, n);
        const HessianStats hm = hessian(a_.mlp, inter, n, true);
        mlp.down = search("down", hm.mean_abs, {{b_.down.data(), d, target(Weight::down)}}, inter,
                          [&, hf = as_float(hm.h)](const std::vector<std::vector<float>>& cand) {
                              return awq_hessian_error_f32(b_.down.data(), cand[0].data(), d, inter,
                                                           hf, &ctx_.pool);
                          });
    }
    awq_fold(c_, b_, mlp);
    scales_.gate_up = mlp.gate_up;
    scales_.down = mlp.down;
    if (!scales_.gate_up.empty()) store_float("mlp_norm", b_.mlp_norm);
    searched_ = folded(std::move(hs), scales_.gate_up);
    have_searched_ = true;
}

}  // namespace qforge
