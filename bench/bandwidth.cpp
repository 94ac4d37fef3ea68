// Memory read bandwidth: the physical limit of batch-1 decode, which reads every weight once per
// token. Sums a float array far larger than the caches (1 GiB by default) with 1 thread and with
// N threads, best of 5 runs each, and prints GB/s (1 GB = 1e9 bytes), so benchmarks can quote
// tokens/s * weight bytes per token / this number as the fraction of bandwidth they reach.
//
//     qforge_bandwidth [--mib 1024] [--reps 5] [--threads N] [--json]
//
// Method: every thread sums its own contiguous slice, each slice first touched (written) by the
// thread that later reads it. Threads are started once and released together through a
// barrier, so a timed run holds no thread creation. Each thread reads its slice as four streams
// side by side (sum_slice), each into its own 8-float vector accumulator (GCC/Clang vector
// extensions: AVX when compiled for it, SSE pairs otherwise): enough loads in flight for DRAM,
// not the adder, to be the limit.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using v8f = float __attribute__((vector_size(32)));
constexpr size_t kLanes = 8, kUnroll = 4, kBlock = kLanes * kUnroll;  // floats per iteration

struct Options {
    size_t mib = 1024;
    int reps = 5;
    unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    bool json = false;
};

[[noreturn]] void usage(const char* msg) {
    std::fprintf(stderr,
                 "qforge_bandwidth: %s\nusage: qforge_bandwidth [--mib 1024] [--reps 5] "
                 "[--threads N] [--json]\n",
                 msg);
    std::exit(2);
}

long parse_positive(const char* s, const char* name) {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (!s[0] || *end || v < 1) usage((std::string(name) + " needs a positive integer").c_str());
    return v;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "--json")
            o.json = true;
        else if (a == "--mib" && has_value)
            o.mib = static_cast<size_t>(parse_positive(argv[++i], "--mib"));
        else if (a == "--reps" && has_value)
            o.reps = static_cast<int>(parse_positive(argv[++i], "--reps"));
        else if (a == "--threads" && has_value)
            o.threads = static_cast<unsigned>(parse_positive(argv[++i], "--threads"));
        else
            usage(("unknown or incomplete option " + a).c_str());
    }
    return o;
}

// The slice's quarters read side by side, kBlock floats of each per step, into one accumulator
// each: on some CPUs a thread reading one stream of bytes gets less of the memory than one reading
// several (an Intel Xeon: 21-25 GB/s as one stream a thread, 28-29 as four; kernels/README.md,
// "Decode: two streams"), and decode reads several.
constexpr size_t kStreams = 4;

float sum_slice(const float* p, size_t n) {
    const size_t q = n / kStreams / kBlock * kBlock;  // floats per stream, whole steps
    v8f a[kStreams] = {};
    for (size_t i = 0; i < q; i += kBlock)
        for (size_t s = 0; s < kStreams; ++s)
            for (size_t u = 0; u < kUnroll; ++u) {
                v8f x;
                std::memcpy(&x, p + s * q + i + u * kLanes, sizeof x);
                a[s] += x;
            }
    const v8f t = (a[0] + a[1]) + (a[2] + a[3]);
    float sum = 0.0f;
    for (size_t k = 0; k < kLanes; ++k) sum += t[k];
    for (size_t i = kStreams * q; i < n; ++i) sum += p[i];
    return sum;
}

struct Result {
    unsigned threads;
    double best_seconds;
    double gb_per_s;
};

Result measure(float* data, size_t n, unsigned threads, int reps) {
    // Slices are whole blocks so every thread runs the vector loop.
    const size_t blocks = n / kBlock, per = blocks / threads, extra = blocks % threads;
    std::vector<size_t> begin(threads + 1, 0);
    for (unsigned t = 0; t < threads; ++t) begin[t + 1] = begin[t] + (per + (t < extra)) * kBlock;
    const size_t floats = begin[threads];

    std::vector<double> sums(threads, 0.0);
    std::barrier start(threads + 1), done(threads + 1);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            // First touch by the reading thread (pages land near it on NUMA machines).
            std::fill(data + begin[t], data + begin[t + 1], 1.0f);
            for (int r = 0; r < reps; ++r) {
                start.arrive_and_wait();
                sums[t] += static_cast<double>(sum_slice(data + begin[t], begin[t + 1] - begin[t]));
                done.arrive_and_wait();
            }
        });
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        // The clock starts before the workers can: on a busy machine the timed span may include
        // a wake-up delay (the result errs low), never miss part of the work (it would err high).
        const auto t0 = std::chrono::steady_clock::now();
        start.arrive_and_wait();
        done.arrive_and_wait();
        const auto t1 = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    }
    for (auto& th : pool) th.join();
    // Every element is 1, so each run sums to `floats`: per-lane float sums are exact below 2^24
    // (2 GiB per thread) and the few adds after them stay within 1e-6. A wrong total means the
    // loop did not read what it claims.
    double total = 0.0;
    for (double s : sums) total += s;
    const double want = static_cast<double>(floats) * reps;
    if (std::abs(total - want) > 1e-5 * want) {
        std::fprintf(stderr, "qforge_bandwidth: checksum %.0f != %.0f\n", total, want);
        std::exit(1);
    }
    return {threads, best, static_cast<double>(floats) * sizeof(float) / best / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    const size_t bytes = o.mib << 20, n = bytes / sizeof(float);
    std::unique_ptr<float, decltype(&std::free)> data(
        static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)), &std::free);
    if (!data) usage("cannot allocate the array");

    std::vector<unsigned> counts{1};
    if (o.threads > 1) counts.push_back(o.threads);
    std::vector<Result> results;
    for (unsigned t : counts) results.push_back(measure(data.get(), n, t, o.reps));

    if (o.json) {
        std::printf("{\"bytes\": %zu, \"reps\": %d, \"results\": [", bytes, o.reps);
        for (size_t i = 0; i < results.size(); ++i)
            std::printf("%s{\"threads\": %u, \"best_seconds\": %.6f, \"gb_per_s\": %.2f}",
                        i ? ", " : "", results[i].threads, results[i].best_seconds,
                        results[i].gb_per_s);
        std::printf("]}\n");
        return 0;
    }
    std::printf("read bandwidth, sum over a %zu MiB float array, best of %d:\n", o.mib, o.reps);
    for (const Result& r : results)
        std::printf("  %2u thread%s %7.1f GB/s\n", r.threads,
                    r.threads == 1 ? ": " : "s:", r.gb_per_s);
    return 0;
}
