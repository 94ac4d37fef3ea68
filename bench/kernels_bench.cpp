// Quantized matrix products at real model shapes: GEMV (decode, m = 1) and GEMM (prefill, m = 16
// and 128) per qtype and activation mode, and float rows (dot_row for one token, the float GEMM
// for several) as the baseline. Reports the weight bytes read per second ("GB/s", 1 GB = 1e9
// bytes) and that as a fraction of this machine kind's read bandwidth ("bw": 21.7 GB/s with 1
// thread, 32.0 with 2; ../shared/PERFORMANCE.md, measured by qforge_bandwidth). kernels/README.md
// holds the results.
//
//     qforge_kernels_bench [--benchmark_filter=gemv/q4_g32] [--benchmark_repetitions=5] ...
//
// Method: each timed iteration multiplies the next of several copies of the weight matrix, enough
// copies (>= 192 MiB) that the 32 MiB L3 cannot hold them, so DRAM is measured. Rows are split
// evenly over 1 or 2 threads: the calling thread and a worker started once that spins (then
// yields) between jobs, so a timed iteration holds no thread creation or sleep/wake. Activations
// are prepared once per benchmark (their cost is measured separately, "prepare/"). "read/" sums
// floats over as many bytes with the same split: the bandwidth the host gave in the same run,
// for side-by-side ratios on a shared machine.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "formats/qtype.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "kernels/cpu/float_gemm.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/qdot.hpp"
#include "kernels/cpu/qpack.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

using namespace qforge;

namespace {

constexpr double kReadGBs[3] = {0.0, 21.7, 32.0};       // by thread count (PERFORMANCE.md)
constexpr uint64_t kRotateBytes = uint64_t{192} << 20;  // > 4 x the 32 MiB L3

struct Shape {
    uint64_t out, in;
};
constexpr Shape kShapes[] = {{576, 1536}, {2048, 5632}, {4096, 4096}, {4096, 14336}};

// The calling thread plus one worker; run(job) calls job(0) here and job(1) there.
class SpinPair {
  public:
    SpinPair() : worker_([this] { loop(); }) {}
    ~SpinPair() {
        stop_ = true;
        gen_.fetch_add(1, std::memory_order_release);
        worker_.join();
    }
    void run(const std::function<void(int)>& job) {
        job_ = &job;
        const uint64_t g = gen_.fetch_add(1, std::memory_order_acq_rel) + 1;
        job(0);
        int spins = 0;
        while (done_.load(std::memory_order_acquire) != g) pause(spins);
    }

  private:
    // Spins briefly, then yields: on a shared, oversubscribed host a waiting thread must not burn
    // the time slice the other one needs.
    static void pause(int& spins) {
        if (++spins < 4096) {
#if defined(__x86_64__)
            _mm_pause();
#endif
        } else {
            std::this_thread::yield();
        }
    }
    void loop() {
        uint64_t seen = 0;
        for (;;) {
            uint64_t g;
            int spins = 0;
            while ((g = gen_.load(std::memory_order_acquire)) == seen) pause(spins);
            if (stop_) return;
            (*job_)(1);
            seen = g;
            done_.store(g, std::memory_order_release);
        }
    }
    std::atomic<uint64_t> gen_{0}, done_{0};
    std::atomic<bool> stop_{false};
    const std::function<void(int)>* job_ = nullptr;
    std::thread worker_;
};

SpinPair& spin_pair() {
    static SpinPair p;
    return p;
}

// Weight copies for one (qtype, shape), kept while consecutive benchmarks share them.
struct Weights {
    QType t;
    Shape s;
    uint64_t stride, bytes, copies;
    std::unique_ptr<uint8_t[]> data;
    std::vector<QPackedRows> packed;  // each copy repacked (qpack.hpp), on first use
    const uint8_t* copy(uint64_t i) const { return data.get() + (i % copies) * bytes; }
};

// w's copies repacked for qmatmul_packed, as the CPU backend does at load.
const std::vector<QPackedRows>& packed_copies(const Weights& w) {
    auto& packed = const_cast<Weights&>(w).packed;
    if (packed.empty())
        for (uint64_t c = 0; c < w.copies; ++c) {
            packed.emplace_back(w.t, w.s.out, w.s.in);
            packed.back().pack(w.copy(c), w.stride, 0, packed.back().tiles());
        }
    return packed;
}

const Weights& weights(QType t, Shape s, uint64_t rotate_bytes = kRotateBytes) {
    static std::unique_ptr<Weights> cached;
    static uint64_t cached_rotate = 0;
    if (cached && cached->t == t && cached->s.out == s.out && cached->s.in == s.in &&
        cached_rotate == rotate_bytes)
        return *cached;
    cached_rotate = rotate_bytes;
    cached.reset();
    auto w = std::make_unique<Weights>();
    w->t = t;
    w->s = s;
    w->stride = *qtype_row_bytes(t, s.in);
    w->bytes = w->stride * s.out;
    w->copies = std::max<uint64_t>(rotate_bytes ? 2 : 1, (rotate_bytes + w->bytes - 1) / w->bytes);
    w->data.reset(new uint8_t[w->copies * w->bytes]);
    // 64 quantized random rows, repeated for valid scales and zeros.
    std::mt19937 rng(42);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    std::vector<float> src(s.in);
    const uint64_t distinct = std::min<uint64_t>(64, s.out);
    for (uint64_t r = 0; r < distinct; ++r) {
        for (auto& v : src) v = dist(rng);
        if (quantize_row_ref(t, src.data(), s.in, w->data.get() + r * w->stride) != QuantStatus::ok)
            std::abort();
    }
    for (uint64_t r = distinct; r < s.out * w->copies; ++r)
        std::memcpy(w->data.get() + r * w->stride, w->data.get() + (r % distinct) * w->stride,
                    w->stride);
    // Then fresh random codes in every row (scales and zeros stay valid), so no two pages are
    // equal and a host that merges identical pages cannot shrink the working set into a cache.
    if (!qtype_traits(t).is_float) {
        const uint64_t codes = qtype_row_layout(t, s.in)->codes_bytes;
        uint64_t x = 0x9e3779b97f4a7c15u;
        for (uint64_t r = 0; r < s.out * w->copies; ++r) {
            uint8_t* p = w->data.get() + r * w->stride;
            for (uint64_t i = 0; i + 8 <= codes; i += 8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                std::memcpy(p + i, &x, 8);
                if (qtype_traits(t).bits == 8)  // int8 codes are -127..127
                    for (uint64_t b = i; b < i + 8; ++b)
                        if (p[b] == 0x80) p[b] = 0x81;
            }
        }
    }
    cached = std::move(w);
    return *cached;
}

std::vector<float> activations(uint64_t m, uint64_t k) {
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(m * k);
    for (auto& v : x) v = dist(rng);
    return x;
}

void set_counters(benchmark::State& state, const Weights& w, uint64_t m, int threads) {
    const double iters = static_cast<double>(state.iterations());
    state.counters["GB/s"] = benchmark::Counter(iters * static_cast<double>(w.bytes) * 1e-9,
                                                benchmark::Counter::kIsRate);
    state.counters["bw"] =
        benchmark::Counter(iters * static_cast<double>(w.bytes) * 1e-9 / kReadGBs[threads],
                           benchmark::Counter::kIsRate);
    state.counters["GMAC/s"] = benchmark::Counter(
        iters * static_cast<double>(w.s.out * w.s.in * m) * 1e-9, benchmark::Counter::kIsRate);
}

// Rows [out * i / threads, out * (i + 1) / threads) for thread i.
void split_rows(int threads, uint64_t n, const std::function<void(uint64_t, uint64_t)>& f) {
    if (threads == 1) return f(0, n);
    spin_pair().run(
        [&](int i) { f(n * static_cast<uint64_t>(i) / 2, n * static_cast<uint64_t>(i + 1) / 2); });
}

// packed: rows repacked at load (int8 mode, the avx512 level), split over the threads at a
// multiple of 32 rows as the CPU backend splits them.
void bm_quant(benchmark::State& state, QType t, Shape s, uint64_t m, QActivations::Mode mode,
              int threads, uint64_t rotate_bytes = kRotateBytes, bool packed = false) {
    const Weights& w = weights(t, s, rotate_bytes);
    const std::vector<QPackedRows>* pk = packed ? &packed_copies(w) : nullptr;
    const auto x = activations(m, s.in);
    QActivations a;
    a.prepare(mode, x.data(), m, s.in);
    std::vector<float> out(m * s.out);
    uint64_t i = 0;
    for (auto _ : state) {
        const uint64_t c = i++;
        const uint8_t* wc = w.copy(c);
        split_rows(threads, s.out, [&](uint64_t r0, uint64_t r1) {
            if (pk) {
                r0 -= r0 % kQmatmulRowGrain;
                if (r1 < s.out) r1 -= r1 % kQmatmulRowGrain;
                qmatmul_packed((*pk)[c % w.copies], r0, r1, a, 0, m, out.data() + r0, s.out);
            } else {
                qmatmul(t, wc, w.stride, r0, r1, a, 0, m, out.data() + r0, s.out);
            }
        });
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    set_counters(state, w, m, threads);
}

// Float rows as the CPU backend multiplies them: one dot_row per row for one token (decode), the
// float GEMM (float_gemm.hpp) for several.
void bm_float(benchmark::State& state, QType t, Shape s, uint64_t m, int threads) {
    const Weights& w = weights(t, s);
    const auto x = activations(m, s.in);
    std::vector<float> out(m * s.out);
    uint64_t i = 0;
    for (auto _ : state) {
        const uint8_t* wc = w.copy(i++);
        split_rows(threads, s.out, [&](uint64_t r0, uint64_t r1) {
            if (m == 1)
                for (uint64_t r = r0; r < r1; ++r)
                    out[r] = dot_row(t, wc + r * w.stride, x.data(), s.in);
            else
                float_matmul(t, wc, w.stride, r0, r1, x.data(), s.in, s.in, 0, m, out.data() + r0,
                             s.out);
        });
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    set_counters(state, w, m, threads);
}

// The side-by-side reference: a plain sum over 192 MiB of floats, split like the products, so
// a product's GB/s can be quoted against the bandwidth the machine gave in the same run.
using v8f = float __attribute__((vector_size(32)));

float sum_floats(const float* p, uint64_t n) {
    v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (uint64_t i = 0; i + 32 <= n; i += 32) {
        v8f v[4];
        std::memcpy(v, p + i, sizeof v);
        a0 += v[0];
        a1 += v[1];
        a2 += v[2];
        a3 += v[3];
    }
    const v8f s = (a0 + a1) + (a2 + a3);
    float r = 0.0f;
    for (int l = 0; l < 8; ++l) r += s[l];
    return r;
}

void bm_read(benchmark::State& state, int threads) {
    const uint64_t n = kRotateBytes / sizeof(float);
    std::vector<float> buf(n);
    for (uint64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i % 65521);  // no equal pages
    float sums[2] = {};
    for (auto _ : state) {
        split_rows(threads, n / 32, [&](uint64_t b, uint64_t e) {
            sums[b == 0 ? 0 : 1] = sum_floats(buf.data() + 32 * b, 32 * (e - b));
        });
        benchmark::DoNotOptimize(sums);
    }
    const double iters = static_cast<double>(state.iterations());
    state.counters["GB/s"] = benchmark::Counter(iters * static_cast<double>(kRotateBytes) * 1e-9,
                                                benchmark::Counter::kIsRate);
    state.counters["bw"] =
        benchmark::Counter(iters * static_cast<double>(kRotateBytes) * 1e-9 / kReadGBs[threads],
                           benchmark::Counter::kIsRate);
}

void bm_prepare(benchmark::State& state, uint64_t m, uint64_t k) {
    const auto x = activations(m, k);
    QActivations a;
    for (auto _ : state) {
        a.prepare(QActivations::Mode::int8, x.data(), m, k);
        benchmark::DoNotOptimize(a.codes(0));
    }
    state.counters["floats/s"] = benchmark::Counter(static_cast<double>(state.iterations() * m * k),
                                                    benchmark::Counter::kIsRate);
}

// One decode token's attention for one KV head: `group` query heads (SmolLM2: 3) of head_dim 64
// against n cached positions, read as the KV cache hands them out (runs of 64 positions, 16 KiB,
// each from its own block), scores then mix, one thread. `bytes` of keys and values in all: 0
// for one head's (L2), else enough heads' caches to rotate through that DRAM serves them.
void bm_attention(benchmark::State& state, uint64_t n, uint64_t bytes) {
    constexpr uint64_t kHd = 64, kGroup = 3, kRun = 64;
    const uint64_t runs = (n + kRun - 1) / kRun, one = runs * kRun * kHd;  // floats per head
    const uint64_t heads = std::max<uint64_t>(1, bytes / (2 * one * sizeof(float)));
    // [run][head][position][element]: a head's runs lie heads x 16 KiB apart.
    std::vector<float> keys(heads * one), values(heads * one);
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : keys) x = u(rng);
    for (float& x : values) x = u(rng);
    std::vector<float> q(kGroup * kHd), scores(kGroup * n), out(kGroup * kHd);
    for (float& x : q) x = u(rng);
    const Isa isa = cpu_isa();
    uint64_t head = 0;
    for (auto _ : state) {
        auto at = [&](const std::vector<float>& v, uint64_t r) {
            return v.data() + ((r * heads + head) * kRun) * kHd;
        };
        auto len = [&](uint64_t r) { return std::min(kRun, n - r * kRun); };
        const uint64_t next_head = (head + 1) % heads;
        auto run_ahead = [&](const std::vector<float>& v, uint64_t r, uint64_t h) -> Ahead {
            return {v.data() + ((r * heads + h) * kRun) * kHd, len(r) * kHd * sizeof(float)};
        };
        // As CpuBackend::attend prefetches: each run's scores the next run's keys (the last
        // run's, the first values), each run's mix the next run's values (the last run's, the
        // next head's first keys).
        for (uint64_t r = 0; r < runs; ++r)
            head_scores(isa, q.data(), kGroup, kHd, at(keys, r), kHd, len(r), 0.125f,
                        scores.data() + r * kRun, n,
                        r + 1 < runs ? run_ahead(keys, r + 1, head) : run_ahead(values, 0, head));
        std::fill(out.begin(), out.end(), 0.0f);
        for (uint64_t r = 0; r < runs; ++r)
            head_mix(isa, scores.data() + r * kRun, n, kGroup, kHd, at(values, r), kHd, len(r),
                     out.data(),
                     r + 1 < runs ? run_ahead(values, r + 1, head) : run_ahead(keys, 0, next_head));
        benchmark::DoNotOptimize(out.data());
        head = (head + 1) % heads;
    }
    state.counters["GMAC/s"] =
        benchmark::Counter(static_cast<double>(state.iterations() * 2 * kGroup * n * kHd) * 1e-9,
                           benchmark::Counter::kIsRate);
    state.counters["GB/s"] =
        benchmark::Counter(static_cast<double>(state.iterations() * 2 * n * kHd * 4) * 1e-9,
                           benchmark::Counter::kIsRate);
}

std::string shape_name(Shape s) { return std::to_string(s.out) + "x" + std::to_string(s.in); }

void register_all() {
    std::vector<QType> quant;  // every quantized type of the qtype table, in its order
    for (const QTypeTraits& row : kQTypes)
        if (!row.is_float) quant.push_back(row.type);
    auto reg = [](const std::string& name, auto fn) {
        benchmark::RegisterBenchmark(name.c_str(), fn)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
    };
    for (int th : {1, 2})
        reg("read/threads:" + std::to_string(th), [=](benchmark::State& st) { bm_read(st, th); });
    // Registered grouped by (qtype, shape), so each weight set is built once.
    for (Shape s : kShapes) {
        for (int th : {1, 2})
            reg("gemv/f16/" + shape_name(s) + "/threads:" + std::to_string(th),
                [=](benchmark::State& st) { bm_float(st, QType::f16, s, 1, th); });
        for (QType t : quant)
            for (auto mode : {QActivations::Mode::int8, QActivations::Mode::f32})
                for (int th : {1, 2}) {
                    const std::string mname = mode == QActivations::Mode::int8 ? "int8" : "f32";
                    reg("gemv/" + std::string(qtype_traits(t).name) + "/" + shape_name(s) + "/" +
                            mname + "/threads:" + std::to_string(th),
                        [=](benchmark::State& st) { bm_quant(st, t, s, 1, mode, th); });
                }
        for (QType t : quant)
            if (qmatmul_packed_serves(cpu_isa(), t))
                for (int th : {1, 2})
                    reg("gemv/" + std::string(qtype_traits(t).name) + "/" + shape_name(s) +
                            "/packed/threads:" + std::to_string(th),
                        [=](benchmark::State& st) {
                            bm_quant(st, t, s, 1, QActivations::Mode::int8, th, kRotateBytes, true);
                        });
    }
    // Decode at SmolLM2's gate/up shape: k = 576 ends in a partial superblock for the g128 types,
    // and a row is a few blocks, so per-row work weighs more than at the shapes above.
    for (QType t : quant)
        if (qmatmul_packed_serves(cpu_isa(), t))
            for (int th : {1, 2})
                reg("gemv/" + std::string(qtype_traits(t).name) +
                        "/1536x576/packed/threads:" + std::to_string(th),
                    [=](benchmark::State& st) {
                        bm_quant(st, t, {1536, 576}, 1, QActivations::Mode::int8, th, kRotateBytes,
                                 true);
                    });
    // Prefill at the two smaller shapes (4096x14336 at m = 128 would take seconds per iteration).
    for (Shape s : {kShapes[0], kShapes[1]})
        for (uint64_t m : {16u, 128u}) {
            for (QType t : {QType::f16, QType::bf16, QType::f32})
                reg("gemm/" + std::string(qtype_traits(t).name) + "/" + shape_name(s) +
                        "/m:" + std::to_string(m) + "/threads:2",
                    [=](benchmark::State& st) { bm_float(st, t, s, m, 2); });
            for (QType t : quant)
                for (auto mode : {QActivations::Mode::int8, QActivations::Mode::f32}) {
                    const std::string mname = mode == QActivations::Mode::int8 ? "int8" : "f32";
                    reg("gemm/" + std::string(qtype_traits(t).name) + "/" + shape_name(s) +
                            "/m:" + std::to_string(m) + "/" + mname + "/threads:2",
                        [=](benchmark::State& st) { bm_quant(st, t, s, m, mode, 2); });
                }
            for (QType t : quant)
                if (qmatmul_packed_serves(cpu_isa(), t))
                    reg("gemm/" + std::string(qtype_traits(t).name) + "/" + shape_name(s) +
                            "/m:" + std::to_string(m) + "/packed/threads:2",
                        [=](benchmark::State& st) {
                            bm_quant(st, t, s, m, QActivations::Mode::int8, 2, kRotateBytes, true);
                        });
        }
    // The same 16-token products with their weights in L3 (2 copies, 8 MiB or more): what the
    // DRAM-bound figures above would be if every line arrived in time.
    for (QType t : quant)
        if (qmatmul_packed_serves(cpu_isa(), t))
            for (Shape s : {kShapes[0], kShapes[1]})
                reg("l3/" + std::string(qtype_traits(t).name) + "/" + shape_name(s) +
                        "/m:16/packed/threads:2",
                    [=](benchmark::State& st) {
                        bm_quant(st, t, s, 16, QActivations::Mode::int8, 2, uint64_t{8} << 20,
                                 true);
                    });
    // A 16-stream step's output head: SmolLM2's tied 49152 x 576 embedding as q8_g32 (30 MiB,
    // from DRAM), and a 4096-row slice of it that stays in L3 (the same rows and tokens: what the
    // whole head would take if its stream arrived in time).
    for (uint64_t rows : {uint64_t{49152}, uint64_t{4096}})
        reg("head/q8_g32/" + std::to_string(rows) + "x576/m:16/packed/" +
                (rows == 49152 ? "dram" : "l3") + "/threads:2",
            [=](benchmark::State& st) {
                bm_quant(st, QType::q8_g32, {rows, 576}, 16, QActivations::Mode::int8, 2,
                         rows == 49152 ? kRotateBytes : 0, true);
            });
    // One thread at 2048 x 2048, m = 128: prefill's compute-bound loop on one core, the figure the
    // instruction-set levels are compared on (one run per QFORGE_ISA; kernels/README.md).
    for (QType t : {QType::f16, QType::bf16, QType::f32})
        reg("gemm/" + std::string(qtype_traits(t).name) + "/2048x2048/m:128/threads:1",
            [=](benchmark::State& st) {
                bm_float(st, t, {2048, 2048}, 128, 1);
            });
    // And at 1536 x 576 (SmolLM2's gate/up: k = 576 ends in a partial superblock), where the
    // per-row work around the inner loop weighs most.
    for (Shape s : {Shape{2048, 2048}, Shape{1536, 576}})
        for (QType t : quant)
            reg("gemm/" + std::string(qtype_traits(t).name) + "/" + shape_name(s) +
                    "/m:128/int8/threads:1",
                [=](benchmark::State& st) {
                    bm_quant(st, t, s, 128, QActivations::Mode::int8, 1);
                });
    // The inner loop's own speed: one copy of 512 x 1024 weights (<= 0.6 MiB) that stays in L2,
    // one thread, CPU time: the ceiling the DRAM-bound figures above are compared with.
    for (QType t : quant)
        for (auto mode : {QActivations::Mode::int8, QActivations::Mode::f32})
            for (uint64_t m : {1u, 16u}) {
                const std::string mname = mode == QActivations::Mode::int8 ? "int8" : "f32";
                benchmark::RegisterBenchmark(("l2/" + std::string(qtype_traits(t).name) +
                                              "/512x1024/m:" + std::to_string(m) + "/" + mname)
                                                 .c_str(),
                                             [=](benchmark::State& st) {
                                                 bm_quant(st, t, {512, 1024}, m, mode, 1, 0);
                                             })
                    ->Unit(benchmark::kMicrosecond);
            }
    // Packed: also SmolLM2's gate/up (1536 x 576, 0.5 MiB at 4 bits: k = 576 is two whole chunks
    // of 8 blocks and one of 2), the rows of a 16-stream serving step.
    for (QType t : quant)
        if (qmatmul_packed_serves(cpu_isa(), t))
            for (Shape s : {Shape{512, 1024}, Shape{1536, 576}})
                for (uint64_t m : {1u, 16u})
                    benchmark::RegisterBenchmark(
                        ("l2/" + std::string(qtype_traits(t).name) + "/" + shape_name(s) +
                         "/m:" + std::to_string(m) + "/packed")
                            .c_str(),
                        [=](benchmark::State& st) {
                            bm_quant(st, t, s, m, QActivations::Mode::int8, 1, 0, true);
                        })
                        ->Unit(benchmark::kMicrosecond);
    for (uint64_t n : {64u, 512u, 2048u})
        for (uint64_t bytes : {uint64_t{0}, kRotateBytes})
            reg("attention/group:3/hd:64/n:" + std::to_string(n) + (bytes ? "/dram" : "/l2") +
                    "/threads:1",
                [=](benchmark::State& st) { bm_attention(st, n, bytes); });
    for (Shape s : kShapes)
        for (uint64_t m : {1u, 128u})
            reg("prepare/k:" + std::to_string(s.in) + "/m:" + std::to_string(m),
                [=](benchmark::State& st) { bm_prepare(st, m, s.in); });
}

}  // namespace

int main(int argc, char** argv) {
    register_all();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::AddCustomContext("cpu_isa", cpu_isa_description());
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
