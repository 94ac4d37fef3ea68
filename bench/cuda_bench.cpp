// qforge_cuda_bench: the GPU numbers the issue asks for, in one run that fits the GPU check.
//
//   copy    device-to-device copy bandwidth (bytes read + written), the ceiling quoted below
//   gemv    y = W x at 4096x4096, 4096x14336, 14336x4096, 2048x5632 (rows x k, torch's [out, in])
//           per qtype: GB/s of (weights + x + y) and the fraction of the copy bandwidth; weights
//           rotate through copies larger than 4x the L2 cache, so the cache is not what is measured
//   gemm    m = 1, 16, 64, 512 tokens through each path (gemv, fused mma, dequantize + cuBLAS) for
//           q4_g128 and q8 at the same shapes: microseconds per product, and cuBLAS on fp16 weights
//           (the baseline) divided by our best path
//   decode  greedy decode tokens/s of a Llama-3-8B-shape model, random weights generated on the
//           device, in f16, q8 and q4_g128 (CUDA graph per token), weight bytes per token and the
//           fraction of the copy bandwidth; decode from position 4096 with the split attention
//           and with one block per query head; the acceptance ratios against f16
//   prefill tokens/s of 512 tokens from position 0 on the same shapes
//   tuning  the GEMV tilings (plans.hpp: GemvTuning) on the decode's shapes, kernel only
//           (activations prepared once; and launched to overlap the one before), then decode
//           tokens/s per tiling, with q/k/v and gate/up as separate launches
//           (CudaBackendOptions::fuse_products false), and without overlapping launches
//
// Prints a table and writes it to --out. Without a CUDA device it prints "SKIPPED: ..." and exits
// 0. Timing: CUDA events around back-to-back launches after warm-up launches; each figure is the
// mean over the timed launches.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "formats/qtype.hpp"
#include "kernels/device_info.hpp"

#ifdef QFORGE_HAVE_CUDA
#include <cublas_v2.h>

#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/launchers.hpp"
#include "kernels/cuda/matmul.hpp"
#include "runtime/cuda_backend.hpp"
#endif

namespace {

struct Args {
    std::string out;
    std::vector<std::string> sections = {"copy",    "gemv",    "gemm",  "decode",
                                         "batched", "prefill", "tuning"};
    std::vector<std::string> qtypes = {"f16", "q8", "q4_g128"};  // decode and prefill
    bool quick = false;           // small sizes: a smoke run, not a measurement
    uint64_t decode_layers = 32;  // Llama-3-8B has 32
    uint64_t prefill_tokens = 512;
    uint64_t decode_steps = 64;
};

void usage(std::FILE* f) {
    std::fprintf(
        f,
        "usage: qforge_cuda_bench [--out FILE]\n"
        "                         [--sections copy,gemv,gemm,decode,batched,prefill,tuning]\n"
        "                         [--quick] [--decode-layers N] [--decode-steps N]\n"
        "                         [--qtypes f16,q8,q4_g128] (decode and prefill)\n");
}

std::vector<std::string> split_commas(const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) v.push_back(item);
    return v;
}

// Returns false (after printing why) on bad arguments.
bool parse(int argc, char** argv, Args& a) {
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&](const char* name) -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "qforge_cuda_bench: %s needs a value\n", name);
                return nullptr;
            }
            return argv[++i];
        };
        auto number = [&](const char* name, uint64_t& dst) {
            const char* v = value(name);
            if (!v) return false;
            char* end = nullptr;
            const unsigned long long n = std::strtoull(v, &end, 10);
            if (*v == '\0' || *end != '\0' || n == 0 || n > 100000) {
                std::fprintf(stderr, "qforge_cuda_bench: %s takes a count 1 .. 100000, not '%s'\n",
                             name, v);
                return false;
            }
            dst = n;
            return true;
        };
        if (arg == "--help" || arg == "-h") {
            usage(stdout);
            std::exit(0);
        } else if (arg == "--out") {
            const char* v = value("--out");
            if (!v) return false;
            a.out = v;
        } else if (arg == "--sections") {
            const char* v = value("--sections");
            if (!v) return false;
            a.sections = split_commas(v);
            for (const auto& s : a.sections)
                if (s != "copy" && s != "gemv" && s != "gemm" && s != "decode" && s != "batched" &&
                    s != "prefill" && s != "tuning") {
                    std::fprintf(stderr, "qforge_cuda_bench: unknown section '%s'\n", s.c_str());
                    return false;
                }
        } else if (arg == "--qtypes") {
            const char* v = value("--qtypes");
            if (!v) return false;
            a.qtypes = split_commas(v);
            for (const auto& t : a.qtypes)
                if (t != "f16" && t != "q8" && t != "q4_g128") {
                    std::fprintf(stderr,
                                 "qforge_cuda_bench: --qtypes takes f16, q8, q4_g128, not '%s'\n",
                                 t.c_str());
                    return false;
                }
        } else if (arg == "--quick") {
            a.quick = true;
        } else if (arg == "--decode-layers") {
            if (!number("--decode-layers", a.decode_layers)) return false;
        } else if (arg == "--decode-steps") {
            if (!number("--decode-steps", a.decode_steps)) return false;
        } else {
            std::fprintf(stderr, "qforge_cuda_bench: unknown argument '%s'\n", arg.c_str());
            return false;
        }
    }
    return true;
}

bool wants(const Args& a, const char* section) {
    return std::find(a.sections.begin(), a.sections.end(), section) != a.sections.end();
}

// Lines printed as they come and kept for --out.
struct Report {
    std::string text;
    void line(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
        char buf[512];
        va_list ap;
        va_start(ap, fmt);
        std::vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        std::printf("%s\n", buf);
        std::fflush(stdout);
        text += buf;
        text += '\n';
    }
};

}  // namespace

#ifdef QFORGE_HAVE_CUDA

namespace {

using namespace qforge;
using namespace qforge::cuda;

constexpr double kGB = 1e9;

struct Shape {
    uint64_t rows, k;
};

// Copies of one random matrix, together more than 4x the L2 cache, to rotate through.
struct Copies {
    std::vector<DeviceBuffer<uint8_t>> bufs;
    std::vector<DeviceMatrix> views;

    Copies(QType t, Shape s, uint64_t l2_bytes, cudaStream_t stream) {
        const GpuMatrixFormat f = gpu_matrix_format(t, s.k);
        const uint64_t bytes = s.rows * f.row_bytes;
        const uint64_t n = std::max<uint64_t>(2, (4 * l2_bytes + bytes - 1) / bytes + 1);
        for (uint64_t i = 0; i < n; ++i) {
            DeviceMatrix m;
            m.fmt = f;
            m.rows = s.rows;
            bufs.emplace_back(bytes);
            m.data = bufs.back().get();
            const RowsParams p = to_rows_params(m);
            if (f.quantized())
                fill_random_quant_rows_launch(p, 0.01f, 1000 + i, stream);
            else
                fill_random_float_rows_launch(p, static_cast<uint32_t>(s.k), 0.02f, 1000 + i,
                                              stream);
            views.push_back(m);
        }
        QF_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    uint64_t bytes() const { return views[0].bytes(); }
};

// Mean seconds per call of fn(i) over `reps` calls after `warmup`.
double time_calls(cudaStream_t stream, int warmup, int reps, const std::function<void(int)>& fn) {
    for (int i = 0; i < warmup; ++i) fn(i);
    Event start, stop;
    start.record(stream);
    for (int i = 0; i < reps; ++i) fn(warmup + i);
    stop.record(stream);
    return stop.ms_since(start) / 1000.0 / reps;
}

double copy_bandwidth(cudaStream_t stream, uint64_t bytes, Report& r) {
    DeviceBuffer<uint8_t> a(bytes), b(bytes);
    a.fill_bytes(1);
    const double s = time_calls(stream, 2, 10, [&](int) {
        QF_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream));
    });
    const double gbs = 2.0 * static_cast<double>(bytes) / s / kGB;
    r.line("copy: %.0f GB/s device-to-device (read + write, %.0f MiB buffers)", gbs,
           static_cast<double>(bytes) / (1 << 20));
    return gbs;
}

struct Gpu {
    int cc_major = 0, sm_count = 0;
    uint64_t l2 = 0;
    std::string name;
};

// A table header: `first`, then one "rows x k" column per shape, 20 characters each.
std::string shapes_header(const char* first, const std::vector<Shape>& shapes) {
    std::string head = first;
    for (const Shape& s : shapes) {
        char col[64];
        std::snprintf(col, sizeof col, " %6llux%-6llu   ", static_cast<unsigned long long>(s.rows),
                      static_cast<unsigned long long>(s.k));
        head += col;
    }
    return head;
}

void bench_gemv(const Args& a, const Gpu& g, cudaStream_t stream, double copy_gbs, Report& r) {
    const std::vector<Shape> shapes =
        a.quick ? std::vector<Shape>{{256, 512}, {512, 1000}}
                : std::vector<Shape>{
                      {4096, 4096}, {4096, 14336}, {14336, 4096}, {2048, 5632}, {1024, 4096}};
    r.line("%s", "");
    r.line(
        "GEMV (decode, 1 token): GB/s of weights + x + y, fraction of the copy bandwidth; "
        "activations f32 (exact) and int8 (quantized rows; the default)");
    r.line("%s", shapes_header("qtype    act ", shapes).c_str());
    for (const auto& row : kCudaQTypes) {
        if (!row.supported) continue;
        const bool quantized = qtype_is_quantized(row.type);
        std::string lines[2];
        for (int int8 = 0; int8 < 2; ++int8) {
            lines[int8] = std::string(qtype_traits(row.type).name);
            lines[int8].resize(9, ' ');
            lines[int8] += int8 ? "int8" : "f32 ";
        }
        for (const Shape& s : shapes) {
            Copies w(row.type, s, g.l2, stream);
            const uint64_t kpad = w.views[0].fmt.kpad;
            DeviceBuffer<float> x(kpad), y(s.rows), scratch(gemv_scratch_floats(kpad));
            x.fill_bytes(0);
            for (int int8 = 0; int8 < (quantized ? 2 : 1); ++int8) {
                const double sec = time_calls(stream, 3, a.quick ? 5 : 40, [&](int i) {
                    launch_gemv(w.views[static_cast<size_t>(i) % w.views.size()], x.get(), kpad, 1,
                                {y.get(), s.rows, nullptr, false}, stream, scratch.get(),
                                {int8 == 1, {}, false});
                });
                const double bytes = static_cast<double>(w.bytes() + 4 * (s.k + s.rows));
                const double gbs = bytes / sec / kGB;
                char cell[64];
                std::snprintf(cell, sizeof cell, " %6.0f GB/s %3.0f%%", gbs,
                              100.0 * gbs / copy_gbs);
                lines[int8] += cell;
            }
        }
        for (int int8 = 0; int8 < (quantized ? 2 : 1); ++int8) r.line("%s", lines[int8].c_str());
    }
}

void bench_gemm(const Args& a, const Gpu& g, cudaStream_t stream, Report& r) {
    const std::vector<Shape> shapes =
        a.quick ? std::vector<Shape>{{512, 1024}}
                : std::vector<Shape>{{4096, 4096}, {4096, 14336}, {14336, 4096}, {2048, 5632}};
    const uint64_t ms[] = {1, 16, 64, 512};
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error("cublasCreate failed");
    cublasSetStream(h, stream);
    r.line("%s", "");
    r.line("GEMM: microseconds per product (rows x k, m tokens); ratio = cuBLAS fp16 time / ours");
    r.line("%-13s %4s %-8s %10s %10s %10s %12s %9s", "shape", "m", "qtype", "gemv", "mma", "cublas",
           "cuBLAS f16", "best/f16");
    for (const Shape& s : shapes) {
        Copies f16(QType::f16, s, g.l2, stream);
        const uint64_t kpad = f16.views[0].fmt.kpad;
        const uint64_t m_max = 512;
        DeviceBuffer<float> x(m_max * kpad), y(m_max * s.rows);
        x.fill_bytes(0);
        DeviceBuffer<uint16_t> x16(m_max * kpad);
        x16.fill_bytes(0);
        for (QType t : {QType::q4_g128, QType::q8}) {
            Copies w(t, s, g.l2, stream);
            const auto scratch = matmul_scratch_size(m_max, kpad, s.rows);
            DeviceBuffer<uint16_t> cx16(scratch.x16_halves), w16(scratch.w16_halves);
            DeviceBuffer<float> ws(std::max<uint64_t>(
                1, mma_workspace_floats(w.views[0].fmt, s.rows, m_max, g.sm_count)));
            MatmulContext ctx;
            ctx.stream = stream;
            ctx.cublas = h;
            ctx.cc_major = g.cc_major;
            ctx.sm_count = g.sm_count;
            ctx.x16 = cx16.get();
            ctx.x16_halves = cx16.size();
            ctx.w16 = w16.get();
            ctx.w16_halves = w16.size();
            ctx.workspace = ws.get();
            ctx.workspace_floats = ws.size();
            for (uint64_t m : ms) {
                const int reps = a.quick ? 3 : (m >= 512 ? 10 : 30);
                double us[3] = {-1, -1, -1};
                const MatmulPath paths[] = {MatmulPath::gemv, MatmulPath::mma, MatmulPath::cublas};
                for (int pi = 0; pi < 3; ++pi) {
                    const MatmulPath p = paths[pi];
                    if (!matmul_path_applies(p, w.views[0].fmt, g.cc_major)) continue;
                    if (p == MatmulPath::gemv && m > 64) continue;  // passes of 8: not a contender
                    ctx.forced = p;
                    us[pi] = 1e6 * time_calls(stream, 2, reps, [&](int i) {
                                 matmul(ctx, w.views[static_cast<size_t>(i) % w.views.size()],
                                        x.get(), kpad, m, {y.get(), s.rows, nullptr, false});
                             });
                }
                const double base =
                    1e6 * time_calls(stream, 2, reps, [&](int i) {
                        const DeviceMatrix& fm =
                            f16.views[static_cast<size_t>(i) % f16.views.size()];
                        cublas_f16_gemm(h, reinterpret_cast<const uint16_t*>(fm.data),
                                        fm.fmt.row_bytes / 2, s.rows, kpad, x16.get(), kpad, m,
                                        y.get(), s.rows, false);
                    });
                double best = 1e30;
                for (double u : us)
                    if (u > 0) best = std::min(best, u);
                char shape[32], cells[3][16];
                std::snprintf(shape, sizeof shape, "%llux%llu",
                              static_cast<unsigned long long>(s.rows),
                              static_cast<unsigned long long>(s.k));
                for (int pi = 0; pi < 3; ++pi) {
                    if (us[pi] > 0)
                        std::snprintf(cells[pi], sizeof cells[pi], "%.1f", us[pi]);
                    else
                        std::snprintf(cells[pi], sizeof cells[pi], "-");
                }
                r.line("%-13s %4llu %-8s %10s %10s %10s %12.1f %8.2fx", shape,
                       static_cast<unsigned long long>(m),
                       std::string(qtype_traits(t).name).c_str(), cells[0], cells[1], cells[2],
                       base, base / best);
            }
        }
    }
    cublasDestroy(h);
}

ModelConfig llama3_8b(uint64_t layers) {
    ModelConfig c;
    c.arch = Architecture::llama;
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = layers;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 8192;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 500000.0;
    c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
    c.tie_word_embeddings = false;
    c.bos_token_id = 128000;
    c.eos_token_ids = {128001};
    return c;
}

ModelConfig bench_model(const Args& a) {
    ModelConfig c = llama3_8b(a.quick ? 2 : a.decode_layers);
    if (a.quick) {
        c.vocab_size = 4096;
        c.hidden_size = 1024;
        c.intermediate_size = 2816;
        c.num_heads = 8;
        c.num_kv_heads = 2;
    }
    return c;
}

std::vector<QType> bench_qtypes(const Args& a) {
    std::vector<QType> v;
    for (const auto& name : a.qtypes) v.push_back(*qtype_from_name(name));  // checked by parse
    return v;
}

// Batched decode: a `qforge serve` step of B sequences (Backend::forward_batch).
void bench_batched(const Args& a, Report& r) {
    const ModelConfig c = bench_model(a);
    r.line("%s", "");
    r.line(
        "batched decode (Backend::forward_batch, a `qforge serve` step: every sequence one token, "
        "its logits to the host), tok/s over all sequences at batch 1, 4, 16, from position 64");
    r.line("%-9s %10s %10s %10s %10s", "qtype", "b=1", "b=4", "b=16", "16 / 1");
    for (QType t : bench_qtypes(a)) {
        CudaBackendOptions o;
        o.max_batch = 64;
        CudaSyntheticModel model(c, t, 42, o);
        double tok_s[3];
        const uint64_t sizes[3] = {1, 4, 16};
        for (int i = 0; i < 3; ++i)
            tok_s[i] = model.time_batched_decode(sizes[i], 4, a.decode_steps, 64).tokens_per_s;
        r.line("%-9s %10.1f %10.1f %10.1f %9.2fx", std::string(qtype_traits(t).name).c_str(),
               tok_s[0], tok_s[1], tok_s[2], tok_s[0] > 0 ? tok_s[2] / tok_s[0] : 0.0);
    }
}

void bench_decode(const Args& a, double copy_gbs, Report& r) {
    const ModelConfig c = bench_model(a);
    r.line("%s", "");
    r.line(
        "decode: Llama-3-8B shapes (%llu layers, hidden %llu, vocab %llu), random weights on the "
        "device,",
        static_cast<unsigned long long>(c.num_layers),
        static_cast<unsigned long long>(c.hidden_size),
        static_cast<unsigned long long>(c.vocab_size));
    r.line("        greedy, one CUDA graph per token, %llu timed steps after 8",
           static_cast<unsigned long long>(a.decode_steps));
    r.line("%-9s %-5s %10s %12s %12s %10s", "qtype", "act", "tok/s", "GB/token", "GB/s", "of copy");
    struct Row {
        QType t;
        double tok_s, bytes;
    };
    std::vector<Row> rows;  // the default (int8 activations for quantized rows)
    for (QType t : bench_qtypes(a)) {
        const bool quantized = qtype_is_quantized(t);
        for (int int8 = quantized ? 1 : 0; int8 >= 0; --int8) {
            CudaBackendOptions o;
            o.max_batch = 1;
            o.int8_activations = int8 == 1;
            CudaSyntheticModel model(c, t, 42, o);
            const auto timing = model.time_greedy_decode(8, a.decode_steps);
            const double bytes = static_cast<double>(model.decode_weight_bytes());
            const double gbs = bytes * timing.tokens_per_s / kGB;
            r.line("%-9s %-5s %10.1f %12.3f %12.0f %9.0f%%",
                   std::string(qtype_traits(t).name).c_str(), int8 ? "int8" : "f32",
                   timing.tokens_per_s, bytes / kGB, gbs, 100.0 * gbs / copy_gbs);
            if (int8 == (quantized ? 1 : 0)) rows.push_back({t, timing.tokens_per_s, bytes});
        }
    }
    auto find = [&](QType t) -> const Row* {
        for (const Row& row : rows)
            if (row.t == t) return &row;
        return nullptr;
    };
    const uint64_t from = a.quick ? 256 : 4096;
    r.line(
        "decode from position %llu (a long context): tok/s with split attention (the default) "
        "and with one block per query head",
        static_cast<unsigned long long>(from));
    for (QType t : bench_qtypes(a)) {
        double tok_s[2];
        for (int split = 1; split >= 0; --split) {
            CudaBackendOptions o;
            o.max_batch = 512;
            o.split_attention_from = split == 1 ? 0 : UINT64_MAX;
            CudaSyntheticModel model(c, t, 42, o);
            tok_s[split] = model.time_greedy_decode(8, a.decode_steps, from).tokens_per_s;
        }
        r.line("%-9s %10.1f %10.1f  (%.2fx)", std::string(qtype_traits(t).name).c_str(), tok_s[1],
               tok_s[0], tok_s[1] / tok_s[0]);
    }
    const Row *f16 = find(QType::f16), *q8 = find(QType::q8), *q4 = find(QType::q4_g128);
    if (!f16 || !q8 || !q4) return;  // --qtypes left one out
    r.line(
        "decode speed over f16 (issue 20's targets): q4_g128 %.2fx (>= 3x: %s), q8 %.2fx (>= "
        "1.8x: %s); byte ratios %.2fx, %.2fx",
        q4->tok_s / f16->tok_s, q4->tok_s >= 3.0 * f16->tok_s ? "met" : "NOT met",
        q8->tok_s / f16->tok_s, q8->tok_s >= 1.8 * f16->tok_s ? "met" : "NOT met",
        f16->bytes / q4->bytes, f16->bytes / q8->bytes);
}

void bench_prefill(const Args& a, Report& r) {
    const ModelConfig c = bench_model(a);
    r.line("%s", "");
    r.line(
        "prefill: %llu tokens from position 0 (the decode section's shapes, %llu layers), best "
        "of 3, tokens/s",
        static_cast<unsigned long long>(a.prefill_tokens),
        static_cast<unsigned long long>(c.num_layers));
    // bf16 as well (Hugging Face checkpoints' own type: the TF32 cuBLAS path; before it, the
    // GEMV in passes of 8 tokens), unless the list names it.
    std::vector<QType> types = bench_qtypes(a);
    if (std::find(types.begin(), types.end(), QType::bf16) == types.end())
        types.push_back(QType::bf16);
    for (QType t : types) {
        CudaBackendOptions o;
        o.max_batch = a.prefill_tokens;
        CudaSyntheticModel model(c, t, 42, o);
        r.line("%-9s %10.1f", std::string(qtype_traits(t).name).c_str(),
               model.time_prefill(a.prefill_tokens, 3));
    }
}

std::string tuning_name(const GemvTuning& t) {
    std::string n = t.min_steps ? "steps=" + std::to_string(t.min_steps) : "";
    if (t.q4_rows) n += (n.empty() ? "" : ",") + std::string("rows=") + std::to_string(t.q4_rows);
    return n.empty() ? "default" : n;
}

void bench_tuning(const Args& a, const Gpu& g, cudaStream_t stream, double copy_gbs, Report& r) {
    const ModelConfig c = bench_model(a);
    const uint64_t d = c.hidden_size, inter = c.intermediate_size;
    const uint64_t qkv = c.q_dim() + 2 * c.kv_dim();
    const std::vector<Shape> shapes = {
        {qkv, d}, {d, c.q_dim()}, {2 * inter, d}, {d, inter}, {c.vocab_size, d}};
    const GemvTuning tunings[] = {{}, {1}, {2}, {4}, {2, 2}, {4, 2}};
    constexpr int kTunings = sizeof tunings / sizeof tunings[0];
    r.line("%s", "");
    r.line(
        "GEMV tilings, kernel only (activations prepared once), 1 token, the decode's shapes "
        "(q|k|v, o, gate|up, down, head): GB/s, fraction of copy");
    r.line("%s", shapes_header("qtype    tiling        ", shapes).c_str());
    for (QType t : bench_qtypes(a)) {
        for (int v = 0; v <= kTunings; ++v) {
            // the tilings, then the default launched to overlap the GEMV before it
            const GemvTuning tuning = v < kTunings ? tunings[v] : GemvTuning{};
            const bool overlap = v == kTunings;
            if (tuning.q4_rows && t != QType::q4_g128) continue;
            std::string line = std::string(qtype_traits(t).name);
            line.resize(9, ' ');
            std::string tn = overlap ? "overlap" : tuning_name(tuning);
            tn.resize(14, ' ');
            line += tn;
            for (const Shape& s : shapes) {
                Copies w(t, s, g.l2, stream);
                const uint64_t kpad = w.views[0].fmt.kpad;
                DeviceBuffer<float> x(kpad), y(s.rows), scratch(gemv_scratch_floats(kpad));
                x.fill_bytes(0);
                const bool int8 = qtype_is_quantized(t);
                launch_gemv(w.views[0], x.get(), kpad, 1, {y.get(), s.rows, nullptr, false}, stream,
                            scratch.get(), {int8, tuning, false});
                const double sec = time_calls(stream, 3, a.quick ? 5 : 40, [&](int i) {
                    launch_gemv(w.views[static_cast<size_t>(i) % w.views.size()], x.get(), kpad, 1,
                                {y.get(), s.rows, nullptr, false}, stream, scratch.get(),
                                {int8, tuning, true, overlap});
                });
                const double gbs = static_cast<double>(w.bytes() + 4 * (s.k + s.rows)) / sec / kGB;
                char cell[64];
                std::snprintf(cell, sizeof cell, " %5.0f GB/s %3.0f%%", gbs,
                              100.0 * gbs / copy_gbs);
                line += cell;
            }
            r.line("%s", line.c_str());
        }
    }
    r.line("%s", "");
    r.line(
        "decode tok/s per tiling (%llu layers), with q/k/v and gate/up unfused, and without "
        "the GEMV's overlapping launch",
        static_cast<unsigned long long>(c.num_layers));
    for (QType t : bench_qtypes(a)) {
        for (int fused = 0; fused < 2; ++fused) {
            for (const GemvTuning& tuning : tunings) {
                if (!fused && (tuning.min_steps || tuning.q4_rows)) continue;
                if (tuning.q4_rows && t != QType::q4_g128) continue;
                CudaBackendOptions o;
                o.max_batch = 1;
                o.fuse_products = fused == 1;
                o.gemv = tuning;
                CudaSyntheticModel model(c, t, 42, o);
                const auto timing = model.time_greedy_decode(8, a.decode_steps);
                r.line("%-9s %-7s %-16s %10.1f tok/s", std::string(qtype_traits(t).name).c_str(),
                       fused ? "fused" : "unfused", tuning_name(tuning).c_str(),
                       timing.tokens_per_s);
            }
        }
        CudaBackendOptions o;
        o.max_batch = 1;
        o.overlap_launches = false;
        CudaSyntheticModel model(c, t, 42, o);
        r.line("%-9s %-24s %10.1f tok/s", std::string(qtype_traits(t).name).c_str(),
               "fused, no overlap", model.time_greedy_decode(8, a.decode_steps).tokens_per_s);
    }
}

int run(const Args& a) {
    std::string why;
    const auto gpus = list_gpus(&why);
    if (gpus.empty()) {
        std::printf("SKIPPED: no CUDA device: %s\n", why.c_str());
        return 0;
    }
    Gpu g;
    g.cc_major = gpus[0].cc_major;
    g.sm_count = gpus[0].sm_count;
    g.name = gpus[0].name;
    int l2 = 0;
    QF_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    g.l2 = static_cast<uint64_t>(l2);
    Report r;
    r.line("qforge_cuda_bench: %s, sm_%d%d, %d SMs, %.0f MiB L2, %.1f GiB; CUDA %s%s",
           g.name.c_str(), gpus[0].cc_major, gpus[0].cc_minor, g.sm_count,
           static_cast<double>(g.l2) / (1 << 20),
           static_cast<double>(gpus[0].memory_bytes) / (1 << 30), cuda_build_version().c_str(),
           a.quick ? " (--quick: smoke sizes, not a measurement)" : "");
    Stream stream;
    double copy_gbs = 1.0;
    if (wants(a, "copy") || wants(a, "gemv") || wants(a, "decode") || wants(a, "tuning"))
        copy_gbs =
            copy_bandwidth(stream.get(), a.quick ? (uint64_t{64} << 20) : (uint64_t{1} << 30), r);
    if (wants(a, "gemv")) bench_gemv(a, g, stream.get(), copy_gbs, r);
    if (wants(a, "gemm")) bench_gemm(a, g, stream.get(), r);
    if (wants(a, "decode")) bench_decode(a, copy_gbs, r);
    if (wants(a, "batched")) bench_batched(a, r);
    if (wants(a, "prefill")) bench_prefill(a, r);
    if (wants(a, "tuning")) bench_tuning(a, g, stream.get(), copy_gbs, r);
    if (!a.out.empty()) {
        std::ofstream f(a.out);
        f << r.text;
        if (!f) throw Error(a.out, {}, "cannot write the table");
    }
    return 0;
}

}  // namespace

#else

namespace {
int run(const Args&) {
    std::printf("SKIPPED: no CUDA device: qforge was built without CUDA\n");
    return 0;
}
}  // namespace

#endif

int main(int argc, char** argv) {
    Args a;
    if (!parse(argc, argv, a)) {
        usage(stderr);
        return 2;
    }
    try {
        return run(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "qforge_cuda_bench: %s\n", e.what());
        return 1;
    }
}
