// The calibration statistics of one linear layer's input: GPTQ's Hessian H = 2/N * sum x x^T
// over the N input rows x (tokens), and AWQ's per-input-channel mean |x|.
//
// Determinism: rows are buffered into chunks of kHessianChunk consecutive rows (chunk boundaries
// are multiples of kHessianChunk counted from the first row ever added), each chunk's float32
// product is computed as fixed kHessianTile x kHessianTile tiles, and the tiles are added to the
// float64 sum chunk after chunk. Every tile is one single-threaded OpenBLAS call on the same
// buffer whichever thread runs it. So H depends only on the rows and their order: never on how
// the caller splits its add() calls, nor on the number of threads.
//
// OpenBLAS's own threads are NOT deterministic: it splits a product's output among its threads
// at thread-count-dependent boundaries, and its kernels sum edge tiles in a different order (on
// this project's machines dgemm, dpotrf and dsymm results change in the last bits between 1 and
// 2 OpenBLAS threads). Hence BlasSingleThread, and parallelism from our ThreadPool over tiles
// whose geometry depends only on the problem's shape.
#pragma once

#include <cstdint>
#include <vector>

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

// While alive, OpenBLAS runs every call on its calling thread (openblas_set_num_threads(1));
// the previous setting is restored afterwards. Process-wide: do not overlap with other code that
// relies on OpenBLAS's threads.
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
    std::vector<double> mean_abs;  // k: 1/N * sum |x[c]| per input channel (AWQ)
};

class HessianAccumulator {
  public:
    // Tiles are spread over `pool`'s threads (the caller's thread alone when null); the pool
    // must outlive the accumulator.
    explicit HessianAccumulator(uint64_t k, ThreadPool* pool = nullptr);

    uint64_t k() const { return k_; }
    uint64_t count() const { return count_; }

    // Adds n rows of k float32 inputs (x: [n][k], row-major). Throws qforge::Error after finish().
    void add(const float* x, uint64_t n);

    // Flushes the last, partial chunk and returns the statistics. Call once; throws qforge::Error
    // when no rows were added or when an input was not finite (H would be NaN or infinite).
    HessianStats finish();

  private:
    void flush_chunk();

    uint64_t k_;
    ThreadPool* pool_;
    uint64_t count_ = 0;
    uint64_t buffered_ = 0;  // rows in chunk_ not yet multiplied
    bool finished_ = false;
    std::vector<float> chunk_;     // [kHessianChunk][k] buffered rows
    std::vector<double> sum_;      // [k][k] float64 sum of chunk products (upper triangle)
    std::vector<double> abs_sum_;  // [k] sum of |x| per channel, in row order
};

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
