// Every CUDA kernel against a CPU reference computed here in double precision from the exact
// dequantized weights (dequantize_row_ref): the products on every path (gemv, fused mma, dequantize
// + cuBLAS) for every supported qtype, m in {1, 2, 3, 8, 16, 64, 512}, k in {576, 1536, 2048, 4096,
// 1000 (not a multiple of any group, nor of 32)}, an odd and an even number of rows; outputs
// poisoned first (NaN bytes) and the columns past the rows checked untouched. Then RMSNorm,
// SwiGLU, RoPE with the fp16 cache write, attention, the embedding lookup, fp16 dequantization,
// argmax, and the typed errors. Skipped with a printed reason when no CUDA device is present.
//
// Tolerances are derived per output element from A = sum_i |w_i x_i| (what rounding errors scale
// with): fp32 accumulation of depth d gives d * 2^-24 * A; rounding the activations to fp16 (the
// tensor-core paths) adds 2^-11 * A; rounding the weights to fp16 (dequantize + cuBLAS) another
// 2^-11 * A; tensor-core fp32 accumulation is allowed 2^-22 per k-step of 16.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/half.hpp"
#include "formats/qtype.hpp"
#include "kernels/device_info.hpp"
#include "runtime/transformer.hpp"
#include "test_support.hpp"

#ifdef QFORGE_HAVE_CUDA
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/launchers.hpp"
#include "kernels/cuda/matmul.hpp"
#endif

namespace cuda_kernels_test {

using namespace qforge;

#ifndef QFORGE_HAVE_CUDA

TEST_CASE("CUDA kernels match the CPU reference", "[cuda]") {
    QF_SKIP("no CUDA device: qforge was built without CUDA");
}

#else

using namespace qforge::cuda;

namespace {

#define QF_REQUIRE_GPU()                                                  \
    do {                                                                  \
        std::string why_;                                                 \
        if (list_gpus(&why_).empty()) QF_SKIP("no CUDA device: " + why_); \
    } while (0)

int cc_major() { return list_gpus().at(0).cc_major; }
int sm_count() { return list_gpus().at(0).sm_count; }

constexpr float kU32 = 1.0f / 16777216.0f;  // 2^-24
constexpr double kHalfRel = 1.0 / 2048.0;   // 2^-11

// The CPU's RMSNorm scale of one row (rms_norm_row's, up to the order of its sum of squares in
// double, which moves the float scale only at a rounding tie), rounded once.
float cpu_rms_scale(const float* x, uint32_t d, double eps) {
    double ss = 0.0;
    for (uint32_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
    return static_cast<float>(1.0 / std::sqrt(ss / d + eps));
}

uint32_t poison_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Runs fn(i) for i in [0, n) on all hardware threads.
template <class F>
void parallel_for(uint64_t n, F&& fn) {
    const unsigned t = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (unsigned w = 0; w < t; ++w)
        pool.emplace_back([&, w] {
            for (uint64_t i = w; i < n; i += t) fn(i);
        });
    for (auto& th : pool) th.join();
}

// A rows x k matrix of qtype t from random weights (rows of norm ~1, a few large weights), in the
// .qf layout, with its exact dequantized weights.
struct HostMatrix {
    QType t;
    uint64_t rows, k;
    std::vector<uint8_t> file;  // rows * qtype_row_bytes
    std::vector<float> w;       // rows * k, dequantized exactly
    // rows * k: |w|, or for super-block types |scale * code| + |min|, the magnitudes of the two
    // terms the kernels sum for it (scale * sum code x - min * sum x), which bound their rounding
    std::vector<float> wmag;
};

HostMatrix make_matrix(QType t, uint64_t rows, uint64_t k, uint32_t seed) {
    HostMatrix m{t, rows, k, {}, {}, {}};
    const uint64_t stride = *qtype_row_bytes(t, k);
    m.file.resize(rows * stride);
    m.w.resize(rows * k);
    m.wmag.resize(rows * k);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(static_cast<float>(k)));
    std::vector<float> row(k);
    for (uint64_t r = 0; r < rows; ++r) {
        for (uint64_t j = 0; j < k; ++j) row[j] = dist(rng) * (j % 97 == 3 ? 8.0f : 1.0f);
        REQUIRE(quantize_row_ref(t, row.data(), k, m.file.data() + r * stride) == QuantStatus::ok);
        dequantize_row_ref(t, m.file.data() + r * stride, k, m.w.data() + r * k);
        for (uint64_t j = 0; j < k; ++j) {
            const uint8_t* fr = m.file.data() + r * stride;
            m.wmag[r * k + j] = qtype_has_super_blocks(t)
                                    ? std::fabs(row_group_scale(t, fr, k, j / 32) *
                                                static_cast<float>(row_code(t, fr, j))) +
                                          std::fabs(row_group_min(t, fr, k, j / 32))
                                    : std::fabs(m.w[r * k + j]);
        }
    }
    return m;
}

struct GpuMatrix {
    DeviceBuffer<uint8_t> buf;
    DeviceMatrix view;
};

GpuMatrix upload(const HostMatrix& m) {
    GpuMatrix g;
    g.view.fmt = gpu_matrix_format(m.t, m.k);
    g.view.rows = m.rows;
    std::vector<uint8_t> packed(m.rows * g.view.fmt.row_bytes);
    repack_rows_for_gpu(g.view.fmt, m.file.data(), g.view.fmt.file_row_bytes, m.rows,
                        packed.data());
    g.buf = DeviceBuffer<uint8_t>(packed.size());
    g.buf.upload(packed);
    g.view.data = g.buf.get();
    return g;
}

// m x k activations, with ldx columns (zero past k).
std::vector<float> make_activations(uint64_t m, uint64_t k, uint64_t ldx, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(m * ldx, 0.0f);
    for (uint64_t t = 0; t < m; ++t)
        for (uint64_t j = 0; j < k; ++j) x[t * ldx + j] = dist(rng);
    return x;
}

struct Reference {
    std::vector<double> y;    // m x rows
    std::vector<double> mag;  // sum_i |w_i x_i|
};

Reference reference(const HostMatrix& w, const std::vector<float>& x, uint64_t ldx, uint64_t m) {
    Reference r;
    r.y.assign(m * w.rows, 0.0);
    r.mag.assign(m * w.rows, 0.0);
    parallel_for(m, [&](uint64_t t) {
        for (uint64_t n = 0; n < w.rows; ++n) {
            double s = 0.0, a = 0.0;
            const float* wr = w.w.data() + n * w.k;
            const float* wm = w.wmag.data() + n * w.k;
            const float* xt = x.data() + t * ldx;
            for (uint64_t j = 0; j < w.k; ++j) {
                s += static_cast<double>(wr[j]) * xt[j];
                a += static_cast<double>(wm[j]) * std::fabs(xt[j]);
            }
            r.y[t * w.rows + n] = s;
            r.mag[t * w.rows + n] = a;
        }
    });
    return r;
}

// The CPU's int8 activation block (kernels/cpu/qdot.cpp's quantize_activation_block), written
// out again: d = fl(amax / 127), codes round-to-even(fl(x / d)) clamped to +-127.
struct Int8Block {
    float d = 0.0f;
    int32_t q[32] = {};
    int32_t sum = 0;
};
Int8Block int8_block(const float* x, uint64_t n) {
    Int8Block b;
    float amax = 0.0f;
    for (uint64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
    b.d = amax / 127.0f;
    if (b.d > 0.0f)
        for (uint64_t j = 0; j < n; ++j) {
            b.q[j] = static_cast<int32_t>(std::clamp(std::nearbyint(x[j] / b.d), -127.0f, 127.0f));
            b.sum += b.q[j];
        }
    return b;
}

// The int8 product of every row and token: sum over blocks b of fl(scale_g * d_b) *
// (sum_i code_i q_i - zero_g * sum_b), each term exact in double; mag sums |terms|.
Reference reference_int8(const HostMatrix& w, const std::vector<float>& x, uint64_t ldx,
                         uint64_t m) {
    Reference r;
    r.y.assign(m * w.rows, 0.0);
    r.mag.assign(m * w.rows, 0.0);
    const uint64_t stride = *qtype_row_bytes(w.t, w.k), blocks = (w.k + 31) / 32;
    const uint64_t group = qtype_traits(w.t).group;
    parallel_for(m, [&](uint64_t t) {
        std::vector<Int8Block> xb(blocks);
        for (uint64_t b = 0; b < blocks; ++b)
            xb[b] = int8_block(x.data() + t * ldx + 32 * b, std::min<uint64_t>(32, w.k - 32 * b));
        for (uint64_t n = 0; n < w.rows; ++n) {
            const uint8_t* row = w.file.data() + n * stride;
            const int8_t* levels = row_levels(w.t, row, w.k);  // level types (carried as q8)
            double s = 0.0, a = 0.0;
            for (uint64_t b = 0; b < blocks; ++b) {
                const uint64_t g = 32 * b / (group ? group : w.k);
                int64_t isum = 0;
                for (uint64_t i = 32 * b; i < std::min(w.k, 32 * b + 32); ++i)
                    isum += int64_t{qtype_code_level(w.t, row_code(w.t, row, i), levels)} *
                            xb[b].q[i - 32 * b];
                isum -= int64_t{row_group_zero(w.t, row, w.k, g)} * xb[b].sum;
                const double term =
                    double{row_group_scale(w.t, row, w.k, g) * xb[b].d} * static_cast<double>(isum);
                // Super-block types: less min * (d * sum), as the CPU's kernels
                const double min_term =
                    double{row_group_min(w.t, row, w.k, g)} *
                    double{xb[b].d * static_cast<float>(xb[b].sum)};  // |sum| <= 32 * 127: exact
                s += term - min_term;
                a += std::fabs(term) + std::fabs(min_term);
            }
            r.y[t * w.rows + n] = s;
            r.mag[t * w.rows + n] = a;
        }
    });
    return r;
}

double tolerance_factor(MatmulPath path, const GpuMatrixFormat& f) {
    const double k = static_cast<double>(f.kpad);
    switch (path) {
        case MatmulPath::gemv:
            return (64.0 + k / 1024.0) * kU32;
        case MatmulPath::mma:
            return kHalfRel + (k / 16.0 + 64.0) * 4.0 * kU32;
        case MatmulPath::cublas:  // bf16: TF32 (activations at most 2^-10, k in steps of 8)
            return (f.kind == WeightKind::f16 ? 1.0 : 2.0) * kHalfRel +
                   (k / (f.kind == WeightKind::bf16 ? 8.0 : 16.0) + 64.0) * 4.0 * kU32;
    }
    return 0.0;
}

struct Ctx {
    Stream stream;
    cublasHandle_t cublas = nullptr;
    DeviceBuffer<uint16_t> x16, w16;
    DeviceBuffer<float> ws;
    MatmulContext mc;

    Ctx(uint64_t m_max, const GpuMatrixFormat& f, uint64_t rows, bool forced_mma_any_m) {
        REQUIRE(cublasCreate(&cublas) == CUBLAS_STATUS_SUCCESS);
        cublasSetStream(cublas, stream.get());
        // A slab of 50 rows, so the cuBLAS path runs several slabs on these small matrices.
        const auto s = matmul_scratch_size(m_max, f.kpad, rows, 50 * f.kpad);
        x16 = DeviceBuffer<uint16_t>(s.x16_halves);
        w16 = DeviceBuffer<uint16_t>(s.w16_halves);
        const uint64_t wsf =
            f.quantized() ? mma_workspace_floats(
                                f, rows, forced_mma_any_m ? m_max : std::min(m_max, kMmaMaxTokens),
                                sm_count())
                          : 0;
        ws = DeviceBuffer<float>(std::max<uint64_t>(wsf, 1));
        mc.stream = stream.get();
        mc.cublas = cublas;
        mc.cc_major = cc_major();
        mc.sm_count = sm_count();
        mc.x16 = x16.get();
        mc.x16_halves = x16.size();
        mc.w16 = w16.get();
        mc.w16_halves = w16.size();
        mc.workspace = ws.get();
        mc.workspace_floats = ws.size();
        mc.gemv_int8 = false;  // exact GEMVs here; int8 activations have their own test
    }
    ~Ctx() { cublasDestroy(cublas); }
};

std::vector<QType> supported_qtypes() {
    std::vector<QType> v;
    for (const auto& row : kCudaQTypes)
        if (row.supported) v.push_back(row.type);
    return v;
}

// Checks one product's output (ldo = rows + 3: the 3 columns past the rows must stay poisoned).
void check_output(const std::vector<float>& got, const Reference& ref, uint64_t m, uint64_t rows,
                  uint64_t ldo, double factor, const std::vector<float>* base,
                  const std::vector<float>* bias) {
    uint64_t bad = 0;
    double worst = 0.0;
    for (uint64_t t = 0; t < m; ++t) {
        for (uint64_t n = 0; n < rows; ++n) {
            double want = ref.y[t * rows + n];
            if (bias) want += (*bias)[n];
            if (base) want += (*base)[t * ldo + n];
            const double g = got[t * ldo + n];
            const double tol = factor * ref.mag[t * rows + n] + 1e-30 +
                               (base || bias ? 4.0 * kU32 * std::fabs(want) : 0.0);
            const double err = std::fabs(g - want);
            if (!(err <= tol)) ++bad;
            if (tol > 0) worst = std::max(worst, err / tol);
        }
        for (uint64_t n = rows; n < ldo; ++n)
            if (!base && poison_bits(got[t * ldo + n]) != 0xffffffffu) ++bad;
    }
    INFO("worst error / tolerance " << worst);
    REQUIRE(bad == 0);
}

}  // namespace

TEST_CASE("CUDA matmul paths match the CPU reference for every qtype and shape", "[cuda]") {
    QF_REQUIRE_GPU();
    const uint64_t ms[] = {1, 2, 3, 8, 16, 64, 512};
    const uint64_t ks[] = {576, 1536, 2048, 4096, 1000};
    const uint64_t rows_list[] = {67, 128};
    const uint64_t m_max = 512;
    for (QType t : supported_qtypes()) {
        for (uint64_t k : ks) {
            for (uint64_t rows : rows_list) {
                const HostMatrix hw = make_matrix(t, rows, k, static_cast<uint32_t>(k + rows));
                GpuMatrix gw = upload(hw);
                const GpuMatrixFormat& f = gw.view.fmt;
                const uint64_t ldx = f.kpad + 4;
                const auto x = make_activations(m_max, k, ldx, static_cast<uint32_t>(k * 3 + rows));
                const Reference ref = reference(hw, x, ldx, m_max);
                DeviceBuffer<float> dx(x.size());
                dx.upload(x);
                const uint64_t ldo = rows + 3;
                DeviceBuffer<float> dy(m_max * ldo);
                Ctx ctx(m_max, f, rows, true);
                for (uint64_t m : ms) {
                    Reference sub{
                        std::vector<double>(ref.y.begin(),
                                            ref.y.begin() + static_cast<long>(m * rows)),
                        std::vector<double>(ref.mag.begin(),
                                            ref.mag.begin() + static_cast<long>(m * rows))};
                    for (MatmulPath path :
                         {MatmulPath::gemv, MatmulPath::mma, MatmulPath::cublas}) {
                        if (!matmul_path_applies(path, f, ctx.mc.cc_major)) continue;
                        INFO(qtype_traits(t).name << " k " << k << " rows " << rows << " m " << m
                                                  << " path " << matmul_path_name(path));
                        dy.fill_bytes(0xff);
                        ctx.mc.forced = path;
                        REQUIRE(matmul(ctx.mc, gw.view, dx.get(), ldx, m,
                                       {dy.get(), ldo, nullptr, false}) == path);
                        ctx.stream.sync();
                        check_output(dy.download(m * ldo), sub, m, rows, ldo,
                                     tolerance_factor(path, f), nullptr, nullptr);
                    }
                }
            }
        }
    }
}

// The GEMV in both activation modes at the ends of its range: k = 172 ends inside a chunk and a
// group; k = 14336 (Llama's down_proj) gives each thread two chunk steps; 1 to 11 tokens (every
// token tile, and two passes). int8 against the CPU's int8 formula (reference_int8): the integer
// sums are exact, so only the float accumulation of one term per 32-block is rounded.
TEST_CASE("CUDA GEMV with float and int8 activations covers long rows and odd k", "[cuda]") {
    QF_REQUIRE_GPU();
    for (QType t : supported_qtypes()) {
        const bool quantized = qtype_is_quantized(t);
        for (uint64_t k : {uint64_t{172}, uint64_t{576}, uint64_t{14336}}) {
            for (uint64_t rows : {uint64_t{5}, uint64_t{67}}) {
                const uint64_t m_max = 11;
                const HostMatrix hw = make_matrix(t, rows, k, static_cast<uint32_t>(k + 7 * rows));
                GpuMatrix gw = upload(hw);
                const GpuMatrixFormat& f = gw.view.fmt;
                const uint64_t ldx = f.kpad;
                const auto x = make_activations(m_max, k, ldx, static_cast<uint32_t>(k + rows));
                const Reference exact = reference(hw, x, ldx, m_max);
                const Reference int8 = quantized ? reference_int8(hw, x, ldx, m_max) : Reference{};
                DeviceBuffer<float> dx(x.size());
                dx.upload(x);
                const uint64_t ldo = rows + 3;
                DeviceBuffer<float> dy(m_max * ldo), scratch(gemv_scratch_floats(f.kpad));
                Stream stream;
                // Every tiling the plan can choose: the default (q4: two chunk steps at 1-2
                // tokens), one, two or four chunk steps per thread, q4 with 2 rows per block;
                // launched to overlap the kernel before (pdl.cuh) but with one step.
                const GemvTuning tunings[] = {{}, {1}, {2}, {4}, {2, 2}, {4, 2}};
                for (uint64_t m :
                     {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{8}, uint64_t{11}})
                    for (const GemvTuning& tuning : tunings) {
                        for (bool i8 : {false, true}) {
                            if (i8 && !quantized) continue;
                            const Reference& ref = i8 ? int8 : exact;
                            const Reference sub{
                                std::vector<double>(ref.y.begin(),
                                                    ref.y.begin() + static_cast<long>(m * rows)),
                                std::vector<double>(ref.mag.begin(),
                                                    ref.mag.begin() + static_cast<long>(m * rows))};
                            INFO(qtype_traits(t).name << " k " << k << " rows " << rows << " m "
                                                      << m << (i8 ? " int8" : " f32") << " steps "
                                                      << tuning.min_steps);
                            dy.fill_bytes(0xff);
                            launch_gemv(gw.view, dx.get(), ldx, m, {dy.get(), ldo, nullptr, false},
                                        stream.get(), scratch.get(),
                                        {i8, tuning, false, tuning.min_steps != 1});
                            stream.sync();
                            const double factor = i8 ? (static_cast<double>(f.chunks) + 64.0) * kU32
                                                     : tolerance_factor(MatmulPath::gemv, f);
                            check_output(dy.download(m * ldo), sub, m, rows, ldo, factor, nullptr,
                                         nullptr);
                        }
                    }
                // A NaN activation makes every row's product NaN in both modes (int8: its
                // block's d is NaN, as on the CPU).
                std::vector<float> bad(x.begin(), x.begin() + static_cast<long>(ldx));
                bad[k / 2] = std::numeric_limits<float>::quiet_NaN();
                dx.upload(bad);
                for (bool i8 : {false, true}) {
                    launch_gemv(gw.view, dx.get(), ldx, 1, {dy.get(), ldo, nullptr, false},
                                stream.get(), scratch.get(), {i8, {}, false});
                    stream.sync();
                    const auto y = dy.download(rows);
                    for (uint64_t n = 0; n < rows; ++n) REQUIRE(std::isnan(y[n]));
                }
            }
        }
    }
}

TEST_CASE("CUDA matmul adds the bias and accumulates into the output", "[cuda]") {
    QF_REQUIRE_GPU();
    for (QType t : {QType::q4_g32, QType::q8_g128, QType::f16, QType::bf16}) {
        const uint64_t rows = 45, k = 333, m_max = 100;
        const HostMatrix hw = make_matrix(t, rows, k, 7);
        GpuMatrix gw = upload(hw);
        const GpuMatrixFormat& f = gw.view.fmt;
        const uint64_t ldx = f.kpad, ldo = rows + 3;
        const auto x = make_activations(m_max, k, ldx, 11);
        const Reference ref = reference(hw, x, ldx, m_max);
        DeviceBuffer<float> dx(x.size());
        dx.upload(x);
        std::vector<float> bias(rows), base(m_max * ldo);
        for (uint64_t i = 0; i < rows; ++i) bias[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;
        for (uint64_t i = 0; i < base.size(); ++i) base[i] = static_cast<float>(i % 11) - 5.0f;
        DeviceBuffer<float> db(rows), dy(base.size());
        db.upload(bias);
        Ctx ctx(m_max, f, rows, true);
        for (uint64_t m : {uint64_t{1}, uint64_t{16}, uint64_t{100}}) {
            Reference sub{
                std::vector<double>(ref.y.begin(), ref.y.begin() + static_cast<long>(m * rows)),
                std::vector<double>(ref.mag.begin(),
                                    ref.mag.begin() + static_cast<long>(m * rows))};
            for (MatmulPath path : {MatmulPath::gemv, MatmulPath::mma, MatmulPath::cublas}) {
                if (!matmul_path_applies(path, f, ctx.mc.cc_major)) continue;
                INFO(qtype_traits(t).name << " m " << m << " path " << matmul_path_name(path));
                dy.upload(base);
                ctx.mc.forced = path;
                matmul(ctx.mc, gw.view, dx.get(), ldx, m, {dy.get(), ldo, db.get(), true});
                ctx.stream.sync();
                check_output(dy.download(m * ldo), sub, m, rows, ldo, tolerance_factor(path, f),
                             &base, &bias);
            }
        }
    }
}

TEST_CASE("CUDA matmul refuses paths and shapes it does not support", "[cuda]") {
    QF_REQUIRE_GPU();
    const HostMatrix hw = make_matrix(QType::f32, 8, 64, 1);
    GpuMatrix gw = upload(hw);
    Ctx ctx(16, gw.view.fmt, 8, true);
    DeviceBuffer<float> dx(16 * 64), dy(16 * 8);
    dx.fill_bytes(0);
    ctx.mc.forced = MatmulPath::mma;
    REQUIRE_THROWS_AS(matmul(ctx.mc, gw.view, dx.get(), 64, 16, {dy.get(), 8, nullptr, false}),
                      UnsupportedOnCuda);
    ctx.mc.forced = MatmulPath::cublas;
    REQUIRE_THROWS_AS(matmul(ctx.mc, gw.view, dx.get(), 64, 16, {dy.get(), 8, nullptr, false}),
                      UnsupportedOnCuda);
    ctx.mc.forced.reset();
    REQUIRE_THROWS_AS(matmul(ctx.mc, gw.view, dx.get(), 62, 16, {dy.get(), 8, nullptr, false}),
                      UnsupportedOnCuda);  // stride below kpad
    REQUIRE_THROWS_AS(matmul(ctx.mc, gw.view, dx.get(), 64, 0, {dy.get(), 8, nullptr, false}),
                      UnsupportedOnCuda);
    // Activations one float off a 16-byte boundary: refused before any launch.
    REQUIRE_THROWS_AS(matmul(ctx.mc, gw.view, dx.get() + 1, 64, 8, {dy.get(), 8, nullptr, false}),
                      UnsupportedOnCuda);
}

TEST_CASE("CUDA embedding lookup and fp16 dequantization are exact", "[cuda]") {
    QF_REQUIRE_GPU();
    Stream s;
    for (QType t : supported_qtypes()) {
        for (uint64_t k : {uint64_t{45}, uint64_t{128}, uint64_t{1000}}) {
            INFO(qtype_traits(t).name << " k " << k);
            const uint64_t rows = 9;
            const HostMatrix hw = make_matrix(t, rows, k, 3);
            GpuMatrix gw = upload(hw);
            const std::vector<int32_t> tokens = {3, 0, 8, 3, 5};
            DeviceBuffer<int32_t> dt(tokens.size());
            dt.upload(tokens);
            const uint64_t ldx = gw.view.fmt.kpad + 1;
            DeviceBuffer<float> dx(tokens.size() * ldx);
            dx.fill_bytes(0xff);
            const RowsParams p = to_rows_params(gw.view);
            embed_rows_launch(p, dt.get(), static_cast<uint32_t>(tokens.size()),
                              static_cast<uint32_t>(k), dx.get(), ldx, s.get());
            s.sync();
            const auto x = dx.download();
            for (size_t i = 0; i < tokens.size(); ++i)
                for (uint64_t j = 0; j < ldx; ++j) {
                    const float want =
                        hw.w[static_cast<uint64_t>(tokens[i]) * k + std::min(j, k - 1)];
                    if (j < k)
                        REQUIRE(poison_bits(x[i * ldx + j]) == poison_bits(want));
                    else
                        REQUIRE(poison_bits(x[i * ldx + j]) == 0xffffffffu);  // untouched
                }
            if (!gw.view.fmt.quantized()) continue;
            DeviceBuffer<uint16_t> dh((rows - 2) * gw.view.fmt.kpad);
            dequantize_rows_to_f16(gw.view, 2, rows - 2, dh.get(), s.get());
            s.sync();
            const auto h = dh.download();
            // Past k the codes are padding (zero codes, or the implicit zero): scale * 0, which
            // is -0 (0x8000) where a row's scale is negative (q4s_*, q8 rows). Either zero
            // contributes nothing to a product, so both are accepted there. Super rows hold -min
            // there (code 0), which meets zero activations only.
            const uint64_t stride = *qtype_row_bytes(t, k);
            for (uint64_t r = 0; r < rows - 2; ++r)
                for (uint64_t j = 0; j < gw.view.fmt.kpad; ++j) {
                    const uint16_t got = h[r * gw.view.fmt.kpad + j];
                    if (j < k)
                        REQUIRE(got == f32_to_f16(hw.w[(r + 2) * k + j]));
                    else if (gw.view.fmt.super_rows)
                        REQUIRE(got == f32_to_f16(0.0f - row_group_min(  // +0 for a min of 0
                                                             t, hw.file.data() + (r + 2) * stride,
                                                             k, j / 32)));
                    else
                        REQUIRE((got == 0x0000 || got == 0x8000));
                }
        }
    }
}

TEST_CASE("CUDA RMSNorm, SwiGLU, residual add and argmax match the CPU formulas", "[cuda]") {
    QF_REQUIRE_GPU();
    Stream s;
    const uint32_t n = 5, d = 300;
    const uint64_t ld = 320;
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> x(n * ld, 0.0f), w(d), up(n * ld, 0.0f);
    for (auto& v : x) v = dist(rng);
    for (auto& v : w) v = 1.0f + 0.1f * dist(rng);
    for (auto& v : up) v = dist(rng);
    DeviceBuffer<float> dx(x.size()), dw(d), dout(x.size()), dup(up.size());
    dx.upload(x);
    dw.upload(w);
    dup.upload(up);
    const double eps = 1e-5;
    dout.fill_bytes(0xff);
    rms_norm_launch(dx.get(), ld, dw.get(), eps, n, d, dout.get(), ld, s.get());
    s.sync();
    auto out = dout.download();
    for (uint32_t t = 0; t < n; ++t) {
        const float scale = cpu_rms_scale(x.data() + t * ld, d, eps);
        for (uint32_t i = 0; i < d; ++i) {
            const float want = w[i] * (x[t * ld + i] * scale);
            REQUIRE(std::fabs(out[t * ld + i] - want) <= 2e-7f * std::fabs(want) + 1e-30f);
        }
        for (uint64_t i = d; i < ld; ++i) REQUIRE(poison_bits(out[t * ld + i]) == 0xffffffffu);
    }

    // A row wider than one float4 per thread of the largest block (8200 = 2050 float4).
    {
        const uint32_t wide = 8200, rows = 2;
        std::vector<float> xw(rows * wide), ww(wide);
        for (auto& v : xw) v = dist(rng);
        for (auto& v : ww) v = 1.0f + 0.1f * dist(rng);
        DeviceBuffer<float> dxw(xw.size()), dww(wide), dow(xw.size());
        dxw.upload(xw);
        dww.upload(ww);
        rms_norm_launch(dxw.get(), wide, dww.get(), eps, rows, wide, dow.get(), wide, s.get());
        s.sync();
        const auto ow = dow.download();
        for (uint32_t t = 0; t < rows; ++t) {
            const float scale = cpu_rms_scale(xw.data() + t * wide, wide, eps);
            for (uint32_t i = 0; i < wide; ++i) {
                const float want = ww[i] * (xw[t * wide + i] * scale);
                REQUIRE(std::fabs(ow[t * wide + i] - want) <= 2e-7f * std::fabs(want) + 1e-30f);
            }
        }
    }

    // Groups (QK-norm): each row holds 3 vectors of 100 (not a multiple of 4: the scalar path),
    // each normalised on its own.
    const uint32_t groups = 3, gw = 100;
    dout.fill_bytes(0xff);
    rms_norm_launch(dx.get(), ld, dw.get(), eps, n, gw, dout.get(), ld, s.get(), groups);
    s.sync();
    out = dout.download();
    for (uint32_t t = 0; t < n; ++t)
        for (uint32_t g = 0; g < groups; ++g) {
            const float* xg = x.data() + t * ld + g * gw;
            const float scale = cpu_rms_scale(xg, gw, eps);
            for (uint32_t i = 0; i < gw; ++i) {
                const float want = w[i] * (xg[i] * scale);
                REQUIRE(std::fabs(out[t * ld + g * gw + i] - want) <=
                        2e-7f * std::fabs(want) + 1e-30f);
            }
        }

    // In place and into another buffer (gate and up rows ld apart, the output ld2 apart).
    DeviceBuffer<float> dg(x.size());
    dg.upload(x);
    const uint64_t ld2 = 304;
    DeviceBuffer<float> dsep(n * ld2);
    swiglu_launch(dg.get(), dup.get(), ld, dsep.get(), ld2, n, d, s.get());
    swiglu_launch(dg.get(), dup.get(), ld, dg.get(), ld, n, d, s.get());
    s.sync();
    out = dg.download();
    const auto sep = dsep.download();
    for (uint32_t t = 0; t < n; ++t)
        for (uint32_t i = 0; i < d; ++i) {
            const float v = x[t * ld + i];
            const float want = (v / (1.0f + std::exp(-v))) * up[t * ld + i];
            REQUIRE(std::fabs(out[t * ld + i] - want) <= 1e-6f * std::fabs(want) + 1e-30f);
            REQUIRE(sep[t * ld2 + i] == out[t * ld + i]);
        }

    dg.upload(x);
    add_inplace_launch(dg.get(), dup.get(), x.size(), s.get());
    s.sync();
    out = dg.download();
    for (size_t i = 0; i < x.size(); ++i) REQUIRE(out[i] == x[i] + up[i]);

    // Argmax with ties: the first index wins, as std::max_element's.
    const uint32_t vocab = 1001;
    std::vector<float> logits(3 * vocab);
    for (auto& v : logits) v = dist(rng);
    logits[0 * vocab + 17] = logits[0 * vocab + 900] = 50.0f;
    logits[1 * vocab + 1000] = 60.0f;
    logits[2 * vocab + 0] = 70.0f;
    DeviceBuffer<float> dl(logits.size());
    dl.upload(logits);
    DeviceBuffer<int32_t> di(3);
    DeviceBuffer<uint8_t> scratch(3 * 8 * kArgmaxMaxParts);
    argmax_rows_launch(dl.get(), vocab, 3, vocab, di.get(), scratch.get(), s.get());
    s.sync();
    auto idx = di.download();
    for (int r = 0; r < 3; ++r) {
        const auto* row = logits.data() + r * vocab;
        REQUIRE(idx[static_cast<size_t>(r)] == std::max_element(row, row + vocab) - row);
    }
    // A Llama-3 vocabulary (many slices): ties across slices, the maximum in the last slice, a
    // NaN that must not win.
    const uint32_t big = 128256;
    REQUIRE(argmax_parts(big) > 1);
    logits.assign(3 * size_t{big}, 0.0f);
    for (auto& v : logits) v = dist(rng);
    logits[0 * size_t{big} + 5000] = logits[0 * size_t{big} + 100000] = 40.0f;
    logits[1 * size_t{big} + big - 1] = 40.0f;
    logits[2 * size_t{big} + 7] = std::nanf("");
    logits[2 * size_t{big} + 70000] = 30.0f;
    DeviceBuffer<float> dbig(logits.size());
    dbig.upload(logits);
    argmax_rows_launch(dbig.get(), big, 3, big, di.get(), scratch.get(), s.get());
    s.sync();
    idx = di.download();
    REQUIRE(idx[0] == 5000);
    REQUIRE(idx[1] == static_cast<int32_t>(big - 1));
    REQUIRE(idx[2] == 70000);
}

// RMSNorm and SwiGLU that write the GEMV's int8 blocks with their output: the same bits as the
// output followed by the GEMV's own preparation (quantize_chunks_launch), for widths that end
// inside a chunk, a width not a multiple of 4 (RMSNorm's two-launch fallback), 1 and 8 tokens,
// and a NaN (its block's scale NaN).
namespace {
void same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        INFO("element " << i);
        REQUIRE(poison_bits(a[i]) == poison_bits(b[i]));
    }
}
}  // namespace

TEST_CASE("CUDA RMSNorm and SwiGLU with int8 blocks equal the separate preparation", "[cuda]") {
    QF_REQUIRE_GPU();
    Stream s;
    std::mt19937 rng(8);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    for (uint32_t d : {300u, 4096u, 302u, 14336u}) {
        for (uint32_t n : {1u, 8u}) {
            INFO("width " << d << " tokens " << n);
            const uint32_t chunks = (d + 31) / 32;
            const uint64_t ld = uint64_t{chunks} * 32;
            std::vector<float> x(n * ld, 0.0f), w(d), up(n * ld, 0.0f);
            for (uint32_t t = 0; t < n; ++t)
                for (uint32_t i = 0; i < d; ++i) {
                    x[t * ld + i] = dist(rng);
                    up[t * ld + i] = dist(rng);
                }
            for (auto& v : w) v = 1.0f + 0.1f * dist(rng);
            if (n == 8) x[3 * ld + d / 2] = std::numeric_limits<float>::quiet_NaN();
            DeviceBuffer<float> dx(x.size()), dw(d), dup(up.size()), dout(x.size());
            dx.upload(x);
            dw.upload(w);
            dup.upload(up);
            // codes, scales, sums: two buffers, each big enough for n tokens' blocks
            const uint64_t codes = 2 * uint64_t{n} * chunks, blocks = uint64_t{n} * chunks;
            DeviceBuffer<uint8_t> fused_q(16 * codes), sep_q(16 * codes);
            DeviceBuffer<float> fused_d(blocks), sep_d(blocks);
            DeviceBuffer<int32_t> fused_s(blocks), sep_s(blocks);
            const Int8Rows q{reinterpret_cast<uint4*>(fused_q.get()), fused_d.get(), fused_s.get(),
                             chunks};
            auto compare = [&] {
                quantize_chunks_launch(dout.get(), ld, n, chunks, sep_q.get(), sep_d.get(),
                                       sep_s.get(), s.get());
                s.sync();
                REQUIRE(fused_q.download() == sep_q.download());
                same_bits(fused_d.download(), sep_d.download());
                REQUIRE(fused_s.download() == sep_s.download());
            };
            dout.fill_bytes(0);
            rms_norm_launch(dx.get(), ld, dw.get(), 1e-5, n, d, dout.get(), ld, s.get(), 1, &q);
            compare();
            DeviceBuffer<float> plain(x.size());
            plain.fill_bytes(0);
            rms_norm_launch(dx.get(), ld, dw.get(), 1e-5, n, d, plain.get(), ld, s.get());
            s.sync();
            same_bits(plain.download(), dout.download());
            if (n == 8) {
                const auto fd = fused_d.download();
                REQUIRE(std::isnan(fd[3 * chunks + (d / 2) / 32]));
            }
            dout.fill_bytes(0);
            swiglu_launch(dx.get(), dup.get(), ld, dout.get(), ld, n, d, s.get(), &q);
            compare();
            swiglu_launch(dx.get(), dup.get(), ld, plain.get(), ld, n, d, s.get());
            s.sync();
            same_bits(plain.download(), dout.download());
        }
    }
}

// Gemma's elementwise operations against the CPU backend's formulas (runtime/cpu_backend.cpp and
// runtime/transformer.hpp's gelu_tanh): the post-norm's residual add, GeGLU, the embedding scale
// and the logit soft-cap; padding columns stay as they were.
TEST_CASE("CUDA post-norm add, GeGLU, scale and soft-cap match the CPU formulas", "[cuda]") {
    QF_REQUIRE_GPU();
    Stream s;
    const uint32_t n = 5, d = 300;
    const uint64_t ld = 320;
    std::mt19937 rng(6);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> x(n * ld), w(d), y(n * ld);
    for (auto& v : x) v = dist(rng);
    for (auto& v : w) v = 1.0f + 0.1f * dist(rng);
    for (auto& v : y) v = dist(rng);
    DeviceBuffer<float> dx(x.size()), dw(d), dy(y.size());
    dx.upload(x);
    dw.upload(w);
    dy.upload(y);
    const double eps = 1e-6;
    rms_norm_add_launch(dx.get(), ld, dw.get(), eps, n, d, dy.get(), ld, s.get());
    s.sync();
    auto out = dy.download();
    for (uint32_t t = 0; t < n; ++t) {
        const float scale = cpu_rms_scale(x.data() + t * ld, d, eps);
        for (uint32_t i = 0; i < d; ++i) {
            // The scale may differ by the order of the double sum: 2 ulp of the added term.
            const float term = w[i] * (x[t * ld + i] * scale), want = y[t * ld + i] + term;
            REQUIRE(std::fabs(out[t * ld + i] - want) <=
                    2.5e-7f * (std::fabs(term) + std::fabs(want)) + 1e-30f);
        }
        for (uint64_t i = d; i < ld; ++i) REQUIRE(out[t * ld + i] == y[t * ld + i]);
    }

    DeviceBuffer<float> dg(x.size());
    dg.upload(x);
    geglu_tanh_launch(dg.get(), dy.get(), ld, dg.get(), ld, n, d, s.get());
    s.sync();
    const auto g = dg.download();
    for (uint32_t t = 0; t < n; ++t) {
        for (uint32_t i = 0; i < d; ++i) {
            // tanhf within 2 ulp of std::tanh; the rest the same operations: 1e-6 relative of the
            // larger of the result and the factors' product (the 1 + tanh cancels near -1).
            const float v = x[t * ld + i], u = out[t * ld + i];
            const float want = gelu_tanh(v) * u;
            REQUIRE(std::fabs(g[t * ld + i] - want) <= 1e-6f * std::fabs(v * u) + 1e-30f);
        }
        for (uint64_t i = d; i < ld; ++i) REQUIRE(g[t * ld + i] == x[t * ld + i]);
    }

    dg.upload(x);
    scale_rows_launch(dg.get(), ld, n, d, 5.656854249f, s.get());
    s.sync();
    const auto scaled = dg.download();
    for (uint32_t t = 0; t < n; ++t)
        for (uint64_t i = 0; i < ld; ++i)
            REQUIRE(scaled[t * ld + i] == (i < d ? x[t * ld + i] * 5.656854249f : x[t * ld + i]));

    const float cap = 3.0f;
    dg.upload(x);
    softcap_rows_launch(dg.get(), ld, n, d, cap, s.get());
    s.sync();
    const auto capped = dg.download();
    for (uint32_t t = 0; t < n; ++t)
        for (uint64_t i = 0; i < ld; ++i) {
            const float v = x[t * ld + i];
            if (i >= d) {
                REQUIRE(capped[t * ld + i] == v);
                continue;
            }
            const float want = std::tanh(v / cap) * cap;
            REQUIRE(std::fabs(capped[t * ld + i] - want) <= 4e-7f * cap);
            REQUIRE(std::fabs(capped[t * ld + i]) <= cap);
        }
}

namespace {

// RoPE then attention on the CPU, in double, over the fp16-rounded cache the GPU stores.
struct AttnCase {
    uint32_t hd, heads, kv_heads, n, pos0;
    float scale = 0.0f, softcap = 0.0f;  // AttentionParams'; 0: head_dim^-1/2, no soft-cap
};

void check_attention(const AttnCase& c) {
    INFO("head_dim " << c.hd << " heads " << c.heads << "/" << c.kv_heads << " n " << c.n
                     << " pos0 " << c.pos0 << " scale " << c.scale << " softcap " << c.softcap);
    Stream s;
    const uint32_t half = c.hd / 2, kvd = c.kv_heads * c.hd, qd = c.heads * c.hd;
    const uint64_t ld = qd + 2 * kvd + 5, capacity = c.pos0 + c.n + 3, ldo = qd + 2;
    std::mt19937 rng(c.hd + c.n);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> qkv(c.n * ld);
    for (auto& v : qkv) v = dist(rng);
    std::vector<float> cs(capacity * half), sn(capacity * half);
    for (uint64_t p = 0; p < capacity; ++p)
        for (uint32_t i = 0; i < half; ++i) {
            const double a = static_cast<double>(p) * std::pow(10000.0, -2.0 * i / c.hd);
            cs[p * half + i] = static_cast<float>(std::cos(a));
            sn[p * half + i] = static_cast<float>(std::sin(a));
        }
    // Earlier positions already in the cache.
    std::vector<uint16_t> kc(capacity * kvd, 0x7e00), vc(capacity * kvd, 0x7e00);  // NaN: unused
    for (uint64_t i = 0; i < static_cast<uint64_t>(c.pos0) * kvd; ++i) {
        kc[i] = f32_to_f16(dist(rng));
        vc[i] = f32_to_f16(dist(rng));
    }
    DeviceBuffer<float> dqkv(qkv.size()), dcs(cs.size()), dsn(sn.size()), dout(c.n * ldo);
    DeviceBuffer<uint16_t> dk(kc.size()), dv(vc.size());
    DeviceBuffer<int32_t> dpos(1), fault(1);
    fault.fill_bytes(0);
    dqkv.upload(qkv);
    dcs.upload(cs);
    dsn.upload(sn);
    dk.upload(kc);
    dv.upload(vc);
    const std::vector<int32_t> pos = {static_cast<int32_t>(c.pos0)};
    dpos.upload(pos);
    dout.fill_bytes(0xff);

    RopeParams rp;
    rp.qkv = dqkv.get();
    rp.ld = ld;
    rp.n = c.n;
    rp.heads = c.heads;
    rp.kv_heads = c.kv_heads;
    rp.head_dim = c.hd;
    rp.cos = dcs.get();
    rp.sin = dsn.get();
    rp.pos0 = dpos.get();
    rp.k_cache = dk.get();
    rp.v_cache = dv.get();
    rp.capacity = static_cast<uint32_t>(capacity);
    rp.fault = fault.get();
    rope_store_kv_launch(rp, s.get());
    AttentionParams ap;
    ap.qkv = dqkv.get();
    ap.ld = ld;
    ap.n = c.n;
    ap.heads = c.heads;
    ap.kv_heads = c.kv_heads;
    ap.head_dim = c.hd;
    ap.k_cache = dk.get();
    ap.v_cache = dv.get();
    ap.pos0 = dpos.get();
    ap.out = dout.get();
    ap.ldo = ldo;
    ap.capacity = rp.capacity;
    ap.fault = rp.fault;
    ap.scale = c.scale;
    ap.softcap = c.softcap;
    attention_launch(ap, attention_dims_per_lane(c.hd), s.get());
    s.sync();
    REQUIRE(fault.download() == std::vector<int32_t>{0});

    // The split (flash-decoding) form: slices of the cache merged by a second launch.
    DeviceBuffer<float> dsplit(c.n * ldo);
    dsplit.fill_bytes(0xff);
    const uint32_t split_len = attention_split_len(static_cast<uint32_t>(capacity));
    const uint32_t slices = static_cast<uint32_t>((capacity + split_len - 1) / split_len);
    DeviceBuffer<float> ws(attention_workspace_floats(c.n, c.heads, c.hd));
    DeviceBuffer<unsigned> counters(attention_counters(c.n, c.heads, c.kv_heads));
    counters.fill_bytes(0);
    {
        AttentionParams sp = ap;
        sp.out = dsplit.get();
        sp.split_len = split_len;
        sp.workspace = ws.get();
        sp.counters = counters.get();
        attention_launch(sp, attention_dims_per_lane(c.hd), s.get());
        s.sync();
        REQUIRE(fault.download() == std::vector<int32_t>{0});
    }

    // With the o product's int8 blocks (head_dim a multiple of 32, 4 dimensions per lane): the
    // same output, and the bits quantize_chunks_launch writes for it.
    if (c.hd % 32 == 0 && attention_dims_per_lane(c.hd) == 4) {
        const uint32_t chunks = qd / 32;
        DeviceBuffer<float> out2(c.n * uint64_t{qd});
        DeviceBuffer<uint8_t> fq(32 * uint64_t{c.n} * chunks), sq(32 * uint64_t{c.n} * chunks);
        DeviceBuffer<float> fd(uint64_t{c.n} * chunks), sd(uint64_t{c.n} * chunks);
        DeviceBuffer<int32_t> fs(uint64_t{c.n} * chunks), ss(uint64_t{c.n} * chunks);
        for (const bool split : {false, true}) {
            INFO((split ? "split" : "one block per head") << " attention with int8 blocks");
            AttentionParams a8 = ap;
            a8.out = out2.get();
            a8.ldo = qd;
            a8.q8 = {reinterpret_cast<uint4*>(fq.get()), fd.get(), fs.get(), chunks};
            if (split)
                a8.split_len = split_len, a8.workspace = ws.get(), a8.counters = counters.get();
            attention_launch(a8, 4, s.get());
            quantize_chunks_launch(out2.get(), qd, c.n, chunks, sq.get(), sd.get(), ss.get(),
                                   s.get());
            s.sync();
            const auto o1 = (split ? dsplit : dout).download(), o2 = out2.download();
            for (uint32_t t = 0; t < c.n; ++t)
                for (uint32_t j = 0; j < qd; ++j)
                    REQUIRE(poison_bits(o2[t * qd + j]) == poison_bits(o1[t * ldo + j]));
            REQUIRE(fq.download() == sq.download());
            const auto d1 = fd.download(), d2 = sd.download();
            for (size_t i = 0; i < d1.size(); ++i)
                REQUIRE(poison_bits(d1[i]) == poison_bits(d2[i]));
            REQUIRE(fs.download() == ss.download());
        }
    }

    // CPU: rotate exactly as runtime/rope.hpp (float products, no fused multiply-add).
    std::vector<float> rq = qkv;
    for (uint32_t t = 0; t < c.n; ++t) {
        const uint64_t p = c.pos0 + t;
        for (uint32_t h = 0; h < c.heads + c.kv_heads; ++h) {
            float* x = rq.data() + t * ld + h * c.hd;
            for (uint32_t i = 0; i < half; ++i) {
                const float a = x[i], b = x[i + half];
                const float ac = a * cs[p * half + i], bs = b * sn[p * half + i];
                const float bc = b * cs[p * half + i], as = a * sn[p * half + i];
                x[i] = ac - bs;
                x[i + half] = bc + as;
            }
        }
        for (uint32_t j = 0; j < kvd; ++j) {
            kc[(c.pos0 + t) * kvd + j] = f32_to_f16(rq[t * ld + qd + j]);
            vc[(c.pos0 + t) * kvd + j] = f32_to_f16(rq[t * ld + qd + kvd + j]);
        }
    }
    const auto gk = dk.download(), gv = dv.download();
    REQUIRE(gk == kc);
    REQUIRE(gv == vc);
    const auto gq = dqkv.download();
    for (uint32_t t = 0; t < c.n; ++t)
        for (uint32_t j = 0; j < qd; ++j)
            REQUIRE(poison_bits(gq[t * ld + j]) == poison_bits(rq[t * ld + j]));

    // The merge counters are left zeroed for the next launch (a graph replays it).
    for (const unsigned v : counters.download()) REQUIRE(v == 0u);
    const double scale = c.scale > 0.0f ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.hd));
    for (const bool split : {false, true}) {
        INFO((split ? "split attention, slices of " : "one block per head") << split_len);
        const auto got = (split ? dsplit : dout).download();
        // The split form's merge rounds once more per partial (4 warps a slice).
        const double merges = split ? 4.0 * slices : 0.0;
        for (uint32_t t = 0; t < c.n; ++t) {
            const uint64_t len = c.pos0 + t + 1;
            for (uint32_t h = 0; h < c.heads; ++h) {
                const uint32_t kvh = h / (c.heads / c.kv_heads);
                const float* q = rq.data() + t * ld + h * c.hd;
                std::vector<double> sc(len);
                double mx = -1e300, score_mag = 0.0;
                for (uint64_t j = 0; j < len; ++j) {
                    double d = 0.0, a = 0.0;
                    for (uint32_t i = 0; i < c.hd; ++i) {
                        const double p =
                            static_cast<double>(q[i]) * f16_to_f32(kc[j * kvd + kvh * c.hd + i]);
                        d += p;
                        a += std::fabs(p);
                    }
                    sc[j] = d * scale;
                    if (c.softcap > 0.0f) sc[j] = std::tanh(sc[j] / c.softcap) * c.softcap;
                    mx = std::max(mx, sc[j]);
                    score_mag = std::max(score_mag, a * scale);
                }
                // A score's fp32 error (dot of head_dim terms, warp-tree sum, scale) shifts its
                // softmax weight by that much relatively; the output moves by at most twice the
                // largest shift times the value magnitude, plus fp32 rounding of the running
                // sums. The soft-cap's tanh has slope <= 1, so it passes the error on, and adds
                // its own divide, tanhf (2 ulp) and product: 4 ulp of the cap.
                const double ds =
                    (c.hd + 8.0) * kU32 * score_mag + 4.0 * kU32 + 4.0 * kU32 * c.softcap;
                const double factor =
                    2.0 * ds + (static_cast<double>(len) + 16.0 + merges) * 4.0 * kU32;
                double sum = 0.0;
                for (auto& v : sc) sum += (v = std::exp(v - mx));
                for (uint32_t i = 0; i < c.hd; ++i) {
                    double o = 0.0, mag = 0.0;
                    for (uint64_t j = 0; j < len; ++j) {
                        const double v = f16_to_f32(vc[j * kvd + kvh * c.hd + i]);
                        o += sc[j] / sum * v;
                        mag += sc[j] / sum * std::fabs(v);
                    }
                    const double g = got[t * ldo + h * c.hd + i];
                    REQUIRE(std::fabs(g - o) <= factor * mag + 1e-30);
                }
            }
            for (uint64_t j = qd; j < ldo; ++j)
                REQUIRE(poison_bits(got[t * ldo + j]) == 0xffffffffu);
        }
    }
}

}  // namespace

TEST_CASE("CUDA RoPE, fp16 cache writes and attention match the CPU", "[cuda]") {
    QF_REQUIRE_GPU();
    const AttnCase cases[] = {
        {8, 8, 8, 1, 0},
        {8, 8, 2, 7, 37},
        {64, 9, 3, 5, 100},
        {96, 4, 4, 3, 10},
        {128, 32, 8, 1, 300},
        {128, 8, 2, 17, 0},
        {256, 4, 1, 2, 65},
        {66, 2, 2, 4, 3},
        // Long contexts (the split form's 32 slices), groups of 8 and of 12 query heads per KV
        // head (the split form's tiles of 8).
        {128, 32, 8, 1, 3000},
        {128, 16, 2, 2, 500},
        {64, 24, 2, 1, 200},
        // Gemma: query_pre_attn_scalar's scale (24^-1/2), gemma2's soft-cap of 2 (scores of 1..3
        // pass through the tanh's bend), and a scale alone.
        {8, 8, 2, 7, 37, 0.2041241452f, 2.0f},
        {256, 4, 1, 9, 20, 0.0625f, 50.0f},
        {64, 9, 3, 5, 100, 0.2f},
    };
    for (const auto& c : cases) check_attention(c);
}

// A batched step's rows name their own caches and positions (CacheRow): RoPE, the cache writes
// and attention (one block per head, and the split form over caches of several capacities with
// one slice length) give each row the bits it gets alone through the single-cache parameters,
// in layer 1 of two-layer caches (the layer stride), and write nothing into another row's cache.
TEST_CASE("CUDA RoPE and attention through per-row caches equal each row alone", "[cuda]") {
    QF_REQUIRE_GPU();
    Stream s;
    const uint32_t hd = 128, heads = 8, kv_heads = 2, kvd = kv_heads * hd;
    const uint64_t ld = (heads + 2 * kv_heads) * hd, ldo = heads * hd;
    const std::vector<uint32_t> caps = {300, 280, 1000, 257, 2000};  // all slices of 64
    const uint32_t n = static_cast<uint32_t>(caps.size()), most = 2000;
    std::mt19937 rng(17);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<int32_t> pos(n);
    std::vector<std::vector<uint16_t> > init(n);  // each row's two-layer cache, as it starts
    for (uint32_t r = 0; r < n; ++r) {
        pos[r] = static_cast<int32_t>(rng() % caps[r]);
        init[r].resize(uint64_t{4} * caps[r] * kvd);
        for (auto& h : init[r]) h = f32_to_f16(dist(rng));
    }
    std::vector<float> qkv(n * ld), table(uint64_t{most} * hd / 2);
    for (auto& v : qkv) v = dist(rng);
    for (auto& v : table) v = std::tanh(dist(rng));
    DeviceBuffer<float> cs(table.size()), sn(table.size());
    cs.upload(table);
    sn.upload(table);
    DeviceBuffer<int32_t> fault(1);
    fault.fill_bytes(0);
    DeviceBuffer<float> ws(attention_workspace_floats(n, heads, hd));
    DeviceBuffer<unsigned> counters(attention_counters(n, heads, kv_heads));
    counters.fill_bytes(0);
    for (const uint32_t split : {0u, attention_split_len(most)}) {
        INFO("split_len " << split);
        auto params = [&](float* q, float* out, uint32_t rows, uint32_t capacity) {
            RopeParams rp;
            rp.qkv = q;
            rp.ld = ld;
            rp.n = rows;
            rp.heads = heads;
            rp.kv_heads = kv_heads;
            rp.head_dim = hd;
            rp.cos = cs.get();
            rp.sin = sn.get();
            rp.capacity = capacity;
            rp.fault = fault.get();
            AttentionParams ap;
            ap.qkv = q;
            ap.ld = ld;
            ap.n = rows;
            ap.heads = heads;
            ap.kv_heads = kv_heads;
            ap.head_dim = hd;
            ap.out = out;
            ap.ldo = ldo;
            ap.capacity = capacity;
            ap.fault = fault.get();
            ap.split_len = split;
            ap.workspace = ws.get();
            ap.counters = counters.get();
            return std::make_pair(rp, ap);
        };
        // RoPE and attention over all n rows in one launch each, row r through rows[r] at layer
        // 1: the rotated q and the outputs.
        auto run_rows = [&](const std::vector<CacheRow>& rows) {
            DeviceBuffer<CacheRow> drows(n);
            drows.upload(rows);
            DeviceBuffer<float> bq(qkv.size()), bout(n * ldo);
            bq.upload(qkv);
            bout.fill_bytes(0xff);
            auto [rp, ap] = params(bq.get(), bout.get(), n, most);
            rp.rows = ap.rows = drows.get();
            rp.layer = ap.layer = 1;
            rope_store_kv_launch(rp, s.get());
            attention_launch(ap, attention_dims_per_lane(hd), s.get());
            s.sync();
            REQUIRE(fault.download() == std::vector<int32_t>{0});
            return std::make_pair(bq.download(), bout.download());
        };
        // Batched: one launch each for all rows.
        std::vector<DeviceBuffer<uint16_t> > batched(n);
        std::vector<CacheRow> rows(n);
        for (uint32_t r = 0; r < n; ++r) {
            batched[r] = DeviceBuffer<uint16_t>(init[r].size());
            batched[r].upload(init[r]);
            const uint64_t cap_kvd = uint64_t{caps[r]} * kvd;
            rows[r].k = batched[r].get();
            rows[r].v = batched[r].get() + cap_kvd;
            rows[r].layer_stride = 2 * cap_kvd;
            rows[r].pos = pos[r];
            rows[r].capacity = caps[r];
        }
        const auto [got_q, got_out] = run_rows(rows);
        // Paged (kv_layout.hpp): the same caches in blocks of 4 positions scattered over one
        // pool, each row's block table a shuffled share of its ids: the same bits, and each
        // cache read back through its table equal to the contiguous one.
        {
            constexpr uint32_t kShift = 2, kPer = 1u << kShift;
            const uint64_t bh = paged_block_halves(2, kShift, kvd);
            std::vector<std::vector<uint32_t> > tables(n);
            std::vector<uint32_t> ids;
            for (uint32_t r = 0; r < n; ++r) {
                tables[r].resize((caps[r] + kPer - 1) / kPer);
                for (size_t i = 0; i < tables[r].size(); ++i)
                    ids.push_back(static_cast<uint32_t>(ids.size()));
            }
            std::shuffle(ids.begin(), ids.end(), rng);
            std::vector<uint32_t> flat;  // the tables, one after another
            std::vector<uint64_t> at(n);
            std::vector<uint16_t> pool(ids.size() * bh, 0);
            auto paged_at = [&](uint32_t r, uint32_t layer, uint32_t which, uint64_t p) {
                return paged_row_offset(tables[r][p >> kShift], bh, layer, which, p, kShift, kvd);
            };
            auto contiguous_at = [&](uint32_t r, uint32_t layer, uint32_t which, uint64_t p) {
                return ((uint64_t{layer} * 2 + which) * caps[r] + p) * kvd;
            };
            for (uint32_t r = 0, next = 0; r < n; ++r) {
                for (auto& id : tables[r]) id = ids[next++];
                at[r] = flat.size();
                flat.insert(flat.end(), tables[r].begin(), tables[r].end());
                for (uint32_t layer = 0; layer < 2; ++layer)
                    for (uint32_t which = 0; which < 2; ++which)
                        for (uint64_t p = 0; p < caps[r]; ++p)
                            std::copy_n(init[r].begin() + static_cast<std::ptrdiff_t>(
                                                              contiguous_at(r, layer, which, p)),
                                        kvd,
                                        pool.begin() + static_cast<std::ptrdiff_t>(
                                                           paged_at(r, layer, which, p)));
            }
            DeviceBuffer<uint16_t> dpool(pool.size());
            dpool.upload(pool);
            DeviceBuffer<uint32_t> dtables(flat.size());
            dtables.upload(flat);
            std::vector<CacheRow> prows(n);
            for (uint32_t r = 0; r < n; ++r) {
                prows[r].k = dpool.get();
                prows[r].blocks = dtables.get() + at[r];
                prows[r].block_halves = bh;
                prows[r].block_shift = kShift;
                prows[r].pos = pos[r];
                prows[r].capacity = caps[r];
            }
            const auto [paged_q, paged_out] = run_rows(prows);
            REQUIRE(std::memcmp(paged_q.data(), got_q.data(), got_q.size() * 4) == 0);
            REQUIRE(std::memcmp(paged_out.data(), got_out.data(), got_out.size() * 4) == 0);
            const auto after = dpool.download();
            for (uint32_t r = 0; r < n; ++r) {
                const auto want = batched[r].download();
                std::vector<uint16_t> back(want.size());
                for (uint32_t layer = 0; layer < 2; ++layer)
                    for (uint32_t which = 0; which < 2; ++which)
                        for (uint64_t p = 0; p < caps[r]; ++p)
                            std::copy_n(after.begin() + static_cast<std::ptrdiff_t>(
                                                            paged_at(r, layer, which, p)),
                                        kvd,
                                        back.begin() + static_cast<std::ptrdiff_t>(
                                                           contiguous_at(r, layer, which, p)));
                INFO("paged row " << r);
                REQUIRE(back == want);
            }
        }
        // Alone: row r with its own cache's layer 1 and its position as pos0.
        for (uint32_t r = 0; r < n; ++r) {
            INFO("row " << r << " capacity " << caps[r] << " position " << pos[r]);
            DeviceBuffer<uint16_t> cache(init[r].size());
            cache.upload(init[r]);
            DeviceBuffer<int32_t> p0(1);
            p0.upload(std::vector<int32_t>{pos[r]});
            DeviceBuffer<float> q(ld), out(ldo);
            q.upload(std::vector<float>(qkv.begin() + r * ld, qkv.begin() + (r + 1) * ld));
            out.fill_bytes(0xff);
            const uint64_t cap_kvd = uint64_t{caps[r]} * kvd;
            // Alone a row's split form is its own capacity's: the same slice length here.
            REQUIRE((split == 0 || attention_split_len(caps[r]) == split));
            auto [ar, aa] = params(q.get(), out.get(), 1, caps[r]);
            ar.pos0 = aa.pos0 = p0.get();
            ar.k_cache = cache.get() + 2 * cap_kvd;
            ar.v_cache = cache.get() + 3 * cap_kvd;
            aa.k_cache = ar.k_cache;
            aa.v_cache = ar.v_cache;
            rope_store_kv_launch(ar, s.get());
            attention_launch(aa, attention_dims_per_lane(hd), s.get());
            s.sync();
            REQUIRE(fault.download() == std::vector<int32_t>{0});
            const auto want_q = q.download(), want_out = out.download();
            REQUIRE(std::memcmp(want_q.data(), got_q.data() + r * ld, ld * 4) == 0);
            REQUIRE(std::memcmp(want_out.data(), got_out.data() + r * ldo, ldo * 4) == 0);
            // The whole cache (layer 0 untouched, layer 1's new position) is the same.
            REQUIRE(cache.download() == batched[r].download());
        }
    }
}

// The device-side bound: positions come from device memory (a graph replays every step), so a
// wrong one must touch nothing outside the cache and raise the fault word the engine checks.
TEST_CASE("CUDA RoPE, attention and record_token refuse a position outside the cache", "[cuda]") {
    QF_REQUIRE_GPU();
    Stream s;
    const uint32_t hd = 8, heads = 2, kv_heads = 1, kvd = kv_heads * hd, capacity = 4;
    const uint64_t ld = (heads + 2 * kv_heads) * hd;
    DeviceBuffer<float> qkv(2 * ld), cs(capacity * hd / 2), sn(capacity * hd / 2),
        out(2 * heads * hd);
    DeviceBuffer<uint16_t> kc(capacity * kvd), vc(capacity * kvd);
    DeviceBuffer<int32_t> pos(1), fault(1), history(capacity), next(1);
    for (auto* b : {&qkv, &cs, &sn}) b->fill_bytes(0);  // rotated k and v are +0
    vc.fill_bytes(0x22);
    history.fill_bytes(0x33);
    next.fill_bytes(0);
    // Token 0 at the last position and token 1 one past it; then token 0 at -1, token 1 at 0.
    for (const int32_t p0 : {static_cast<int32_t>(capacity - 1), -1}) {
        INFO("pos0 " << p0);
        kc.fill_bytes(0x11);
        out.fill_bytes(0xff);
        fault.fill_bytes(0);
        pos.upload(std::vector<int32_t>{p0});
        RopeParams rp;
        rp.qkv = qkv.get();
        rp.ld = ld;
        rp.n = 2;
        rp.heads = heads;
        rp.kv_heads = kv_heads;
        rp.head_dim = hd;
        rp.cos = cs.get();
        rp.sin = sn.get();
        rp.pos0 = pos.get();
        rp.k_cache = kc.get();
        rp.v_cache = vc.get();
        rp.capacity = capacity;
        rp.fault = fault.get();
        rope_store_kv_launch(rp, s.get());
        s.sync();
        REQUIRE(fault.download() == std::vector<int32_t>{kFaultPosition});
        // Exactly the positions inside the cache were written (an outside one would have hit
        // another allocation: the buffers hold exactly `capacity` positions).
        const auto k = kc.download();
        for (int32_t p = 0; p < static_cast<int32_t>(capacity); ++p)
            REQUIRE((k[static_cast<uint32_t>(p) * kvd] == 0x1111) == (p != p0 && p != p0 + 1));

        fault.fill_bytes(0);
        AttentionParams ap;
        ap.qkv = qkv.get();
        ap.ld = ld;
        ap.n = 2;
        ap.heads = heads;
        ap.kv_heads = kv_heads;
        ap.head_dim = hd;
        ap.k_cache = kc.get();
        ap.v_cache = vc.get();
        ap.pos0 = pos.get();
        ap.out = out.get();
        ap.ldo = heads * hd;
        ap.capacity = capacity;
        ap.fault = fault.get();
        attention_launch(ap, attention_dims_per_lane(hd), s.get());
        s.sync();
        REQUIRE(fault.download() == std::vector<int32_t>{kFaultPosition});
        // The token outside left its output row as it was; the one inside wrote its row.
        const auto o = out.download();
        const uint32_t outside = p0 < 0 ? 0 : 1;
        for (uint32_t i = 0; i < heads * hd; ++i) {
            REQUIRE(poison_bits(o[outside * heads * hd + i]) == 0xffffffffu);
            REQUIRE(poison_bits(o[(1 - outside) * heads * hd + i]) != 0xffffffffu);
        }
    }
    // record_token at the end of the history: refused, the position stays.
    fault.fill_bytes(0);
    pos.upload(std::vector<int32_t>{static_cast<int32_t>(capacity)});
    record_token_launch(next.get(), pos.get(), history.get(), capacity, fault.get(), s.get());
    s.sync();
    REQUIRE(fault.download() == std::vector<int32_t>{kFaultPosition});
    REQUIRE(pos.download() == std::vector<int32_t>{static_cast<int32_t>(capacity)});
    for (const int32_t h : history.download()) REQUIRE(h == 0x33333333);
}

// fp16 activations saturate instead of overflowing to infinity, and count what they clamp.
TEST_CASE("CUDA fp32 -> fp16 rows saturate beyond +-65504 and count it", "[cuda]") {
    QF_REQUIRE_GPU();
    Stream s;
    const std::vector<float> x = {1.0f,  65504.0f, 65519.0f,      65520.0f, -1e6f,
                                  1e38f, -0.0f,    std::nanf(""), 3.0e-8f,  -70000.0f};
    const uint32_t k = static_cast<uint32_t>(x.size()), ld16 = 16, m_pad = 2;
    DeviceBuffer<float> dx(x.size());
    dx.upload(x);
    DeviceBuffer<uint16_t> d16(m_pad * ld16);
    DeviceBuffer<unsigned long long> count(1);
    count.fill_bytes(0);
    d16.fill_bytes(0xff);
    f32_to_f16_rows_launch(dx.get(), k, 1, m_pad, k, d16.get(), ld16, count.get(), s.get());
    s.sync();
    const auto h = d16.download();
    for (uint32_t j = 0; j < k; ++j) {
        INFO("x = " << x[j]);
        const float v = x[j];
        const uint16_t want = std::isfinite(v) && std::fabs(v) >= 65520.0f
                                  ? (v > 0 ? uint16_t{0x7bff} : uint16_t{0xfbff})
                                  : f32_to_f16(v);
        if (std::isnan(v))
            REQUIRE(std::isnan(f16_to_f32(h[j])));
        else
            REQUIRE(h[j] == want);
    }
    for (uint32_t j = k; j < m_pad * ld16; ++j) REQUIRE(h[j] == 0);   // padding is zero
    REQUIRE(count.download() == std::vector<unsigned long long>{4});  // 65520, -1e6, 1e38, -7e4
}

#endif  // QFORGE_HAVE_CUDA

}  // namespace cuda_kernels_test
