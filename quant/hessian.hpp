// The calibration statistics of one linear layer's input: GPTQ's Hessian H = 2/N * sum x x^T
// over the N input rows x (tokens), and AWQ's per-input-channel mean |x|.
//
// Determinism: rows are buffered into chunks of kHessianChunk consecutive rows (chunk boundaries
// are multiples of kHessianChunk counted from the first row ever added), each chunk's float32
// product is computed as fixed kHessianTile x kHessianTile tiles, and the tiles are added to the
// float64 sum chunk after chunk (tile by tile over a run of chunks, so each tile's float64 sum
// stays in cache). Every tile is one single-threaded OpenBLAS call whichever thread runs it, on
// the chunk's rows where the caller holds them or in the chunk buffer (OpenBLAS packs its
// operands first: where they lie does not change the result). So H depends only on the rows and
// their order: never on how the caller splits its add() calls, nor on the number of threads.
//
// OpenBLAS's own threads are NOT deterministic: it splits a product's output among its threads
// at thread-count-dependent boundaries, and its kernels sum edge tiles in a different order (on
// this project's machines dgemm, dpotrf and dsymm results change in the last bits between 1 and
// 2 OpenBLAS threads). Hence BlasSingleThread, and parallelism from our ThreadPool over tiles
// whose geometry depends only on the problem's shape.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/bf16_gemm.hpp"
#include "quant/calibration.hpp"

namespace qforge {

class ThreadPool;

// Rows per float32 product. Why float32 products are acceptable: they run about twice as fast as
// float64 ones, and a sum of at most 256 float32 products of well-scaled activations has a
// relative error of about 1e-5 (sqrt(256) * 2^-24 typical, 256 * 2^-24 worst), far below the
// 1e-2 relative damping GPTQ adds to the diagonal anyway; the chunk sums are then added in
// float64, so the error does not grow with the number of tokens.
inline constexpr uint64_t kHessianChunk = 256;
// Inputs per side of one tile of a chunk's product: big enough for OpenBLAS's kernels to run at
// full speed, small enough to give every thread work (k = 2048: 36 tiles per chunk).
inline constexpr uint64_t kHessianTile = 256;

// OpenBLAS's kernels for this CPU, chosen once per process, by the first BlasSingleThread.
// A DYNAMIC_ARCH OpenBLAS picks its kernels by CPU model when it loads, and a release older than
// the CPU falls back to generic SSE3 kernels: OpenBLAS 0.3.21 (Debian 12) calls this project's
// Xeons (family 6, model 207) "Prescott", and its sgemm then runs at 21 GFLOP/s on one core
// against 92 with its SkylakeX kernels (the whole calibrated pipeline: its products, H, GPTQ's
// factorisations and updates). So when OPENBLAS_CORETYPE is not set and the kernels OpenBLAS
// chose use less than cpu_isa() (kernels/cpu/isa.hpp: the CPU's level, capped by QFORGE_ISA),
// they are chosen again: SkylakeX for avx512, Haswell for avx2. A BLAS without the run-time
// choice (not DYNAMIC_ARCH) is left as it is. Returns OpenBLAS's name of the kernels in use,
// which the .qf header records (products and H depend on them in the last bits).
std::string blas_kernels();
// When OPENBLAS_CORETYPE names kernels below the CPU's level (cpu_isa()), the line saying so,
// for a notice (calibration then runs slower: on a Zen 5 with OPENBLAS_CORETYPE=Haswell, GPTQ on
// SmolLM2-135M took 245 s against 184 s with SkylakeX); otherwise empty.
std::string blas_kernels_notice();

// While alive, OpenBLAS runs every call on its calling thread (openblas_set_num_threads(1));
// the previous setting is restored afterwards. Process-wide: do not overlap with other code that
// relies on OpenBLAS's threads. The first one also settles blas_kernels().
class BlasSingleThread {
  public:
    BlasSingleThread();
    ~BlasSingleThread();
    BlasSingleThread(const BlasSingleThread&) = delete;
    BlasSingleThread& operator=(const BlasSingleThread&) = delete;

  private:
    int saved_;
};

struct HessianStats {
    uint64_t k = 0;                // inputs (columns of x)
    uint64_t count = 0;            // N: rows added
    std::vector<double> h;         // k * k, row-major and symmetric: 2/N * sum x x^T
    std::vector<double> mean_abs;  // k: 1/N * sum |x[c]| per input channel (AWQ); or empty
};

// With CalibProducts::bf16 each chunk's product is bf16_gram of its rows rounded to bf16
// (kernels/cpu/bf16_gemm.hpp: one f32 chain per entry over the chunk's 128 pairs of rows, in row
// order), its columns packed once per chunk; tiles of kHessianTileBf16 only split the work. The
// chunks, their float64 sum and hence the determinism are as above. Each input is rounded to 8
// significant bits, so a product moves by at most 2^-7 + 2^-16 of itself: far below GPTQ's 1e-2
// damping. (Chunks of 1024 rows ran slower: a register tile's 512 pairs of weights, 96 KiB, no
// longer stay in L1.)
inline constexpr uint64_t kHessianTileBf16 = 96;  // 6 tiles of 16 rows: 2 register tiles
// On AMX tiles (bf16_kernel() == amx) a chunk is 1024 rows, its chain 512 pairs: with 256 rows the
// float64 sums of the tiles and each product's tile set-up cost about a third of the products'
// time (GPTQ on SmolLM2-135M: its Gram products 9.2 s of 71, with 1024 rows 6.7 s); the chain's
// bound grows to (1024 + 5) 2^-24 (about 2^-14; a product's rounding each), still far below 2^-7.
inline constexpr uint64_t kHessianChunkAmx = 1024;

class HessianAccumulator {
  public:
    // Tiles are spread over `pool`'s threads (the caller's thread alone when null); the pool
    // must outlive the accumulator. bf16 needs bf16_dot_available(). Without mean_abs the
    // statistics' mean_abs stays empty (GPTQ reads H alone: the sums were a pass over the rows,
    // 2 of SmolLM2-135M's 70 s of GPTQ).
    explicit HessianAccumulator(uint64_t k, ThreadPool* pool = nullptr,
                                CalibProducts products = CalibProducts::f32, bool mean_abs = true);

    uint64_t k() const { return k_; }
    uint64_t count() const { return count_; }
    // Rows per chunk: kHessianChunk, or kHessianChunkAmx for bf16 products on AMX tiles.
    uint64_t chunk_rows() const { return chunk_rows_; }

    // Adds n rows of k float32 inputs (x: [n][k], row-major). Throws qforge::Error after finish().
    void add(const float* x, uint64_t n);

    // Flushes the last, partial chunk and returns the statistics. Call once; throws qforge::Error
    // when no rows were added or when an input was not finite (H would be NaN or infinite).
    HessianStats finish();

  private:
    void flush_chunk();
    // Adds the products of `chunks` consecutive chunks of `rows` rows each at x.
    void multiply_chunks(const float* x, uint64_t chunks, uint64_t rows);
    void multiply_chunks_bf16(const float* x, uint64_t chunks, uint64_t rows);

    uint64_t k_;
    uint64_t chunk_rows_;
    ThreadPool* pool_;
    CalibProducts products_;
    uint64_t count_ = 0;
    uint64_t buffered_ = 0;  // rows in chunk_ not yet multiplied
    bool finished_ = false;
    std::vector<float> chunk_;     // [chunk_rows_][k] buffered rows
    std::vector<double> sum_;      // [k][k] float64 sum of chunk products (upper triangle)
    std::vector<double> abs_sum_;  // [k] sum of |x| per channel, in row order (empty: not kept)
};

// For `forms` matrices E_f of `rows` rows of k, filled row by row by fill(r, s) (s: `forms` rows
// of k doubles, E_0[r] first), returns trace(E_f H E_f^T) for each f, H's lower triangle and
// diagonal read from h (row-major k x k). Rows go in fixed batches of kQuadraticRows (one
// single-threaded dsymm each, spread over `pool`) and the per-row values are summed in row order,
// so the sums do not depend on the threads (BlasSingleThread must be alive).
inline constexpr uint64_t kQuadraticRows = 128;
std::vector<double> quadratic_forms(const double* h, uint64_t k, uint64_t rows, uint64_t forms,
                                    ThreadPool* pool,
                                    const std::function<void(uint64_t, double*)>& fill);
// The same with float32 products (ssymm on a float32 H, each row's dot summed in float64): twice
// the speed, each (H e)_i a float sum of k products (relative error about k 2^-24 at worst), for
// values that only rank candidates (AWQ's scale searches).
std::vector<double> quadratic_forms_f32(const float* h, uint64_t k, uint64_t rows, uint64_t forms,
                                        ThreadPool* pool,
                                        const std::function<void(uint64_t, float*)>& fill);

// GPTQ's factor of a damped Hessian, in place. `a` is k * k row-major; its strict lower triangle
// holds H (in the order the columns will be visited) and is left untouched; H' is H with
// diag[i] + add on the diagonal. On success the upper triangle (diagonal included) holds the
// upper Cholesky factor U of H'^-1 (H'^-1 = U^T U, U[i][i] > 0) and true is returned; false when
// H' is not numerically positive definite (the upper triangle is then garbage). Runs in fixed
// kFactorTile tiles spread over `pool` (single-threaded OpenBLAS per tile: deterministic for any
// thread count). hessian.cpp derives the method: one Cholesky factorisation and one triangular
// inverse of the reversed matrix.
inline constexpr uint64_t kFactorTile = 256;
bool inverse_cholesky_upper(double* a, uint64_t k, const std::vector<double>& diag, double add,
                            ThreadPool* pool);

}  // namespace qforge
