// Owning handles for device memory, streams and events, so every allocation is freed and every
// call is checked (QF_CUDA_CHECK). Host-side C++; used by the backend, the tests and the benchmark.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"

namespace qforge::cuda {

// `count` elements of T in device memory (cudaMalloc; never managed memory).
template <class T>
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(uint64_t count) : count_(count) {
        if (count) QF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), count * sizeof(T)));
    }
    ~DeviceBuffer() {
        if (p_) cudaFree(p_);
    }
    DeviceBuffer(DeviceBuffer&& o) noexcept
        : p_(std::exchange(o.p_, nullptr)), count_(std::exchange(o.count_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            if (p_) cudaFree(p_);
            p_ = std::exchange(o.p_, nullptr);
            count_ = std::exchange(o.count_, 0);
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    T* get() const { return p_; }
    uint64_t size() const { return count_; }
    uint64_t bytes() const { return count_ * sizeof(T); }

    // Transfers and fills here are ordered with the work of every stream: the device is idle
    // before and after each. cudaMemcpy and cudaMemset run on the legacy default stream, which
    // does not wait for (nor make wait) the non-blocking streams every kernel runs on: without
    // the synchronisation a poison fill could land after a kernel's output, an upload after the
    // kernel that reads it, a download before the kernel that writes it. They serve loading and
    // tests; the forward pass copies on its own stream (runtime/cuda_forward.cpp).
    void upload(const T* src, uint64_t n, uint64_t offset = 0) {
        QF_CUDA_CHECK(cudaDeviceSynchronize());
        QF_CUDA_CHECK(cudaMemcpy(p_ + offset, src, n * sizeof(T), cudaMemcpyHostToDevice));
        QF_CUDA_CHECK(cudaDeviceSynchronize());
    }
    void upload(const std::vector<T>& v) { upload(v.data(), v.size()); }
    std::vector<T> download(uint64_t n, uint64_t offset = 0) const {
        std::vector<T> v(n);
        QF_CUDA_CHECK(cudaDeviceSynchronize());
        QF_CUDA_CHECK(cudaMemcpy(v.data(), p_ + offset, n * sizeof(T), cudaMemcpyDeviceToHost));
        return v;
    }
    std::vector<T> download() const { return download(count_); }
    // Every byte set to `byte` (0xff poisons floats with NaN).
    void fill_bytes(int byte) {
        if (!count_) return;
        QF_CUDA_CHECK(cudaDeviceSynchronize());
        QF_CUDA_CHECK(cudaMemset(p_, byte, bytes()));
        QF_CUDA_CHECK(cudaDeviceSynchronize());
    }

  private:
    T* p_ = nullptr;
    uint64_t count_ = 0;
};

class Stream {
  public:
    Stream() { QF_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~Stream() { cudaStreamDestroy(s_); }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    cudaStream_t get() const { return s_; }
    void sync() const { QF_CUDA_CHECK(cudaStreamSynchronize(s_)); }

  private:
    cudaStream_t s_ = nullptr;
};

class Event {
  public:
    Event() { QF_CUDA_CHECK(cudaEventCreate(&e_)); }
    ~Event() { cudaEventDestroy(e_); }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    cudaEvent_t get() const { return e_; }
    void record(cudaStream_t s) { QF_CUDA_CHECK(cudaEventRecord(e_, s)); }
    // Milliseconds from `start` to this event (both recorded; waits for this one).
    float ms_since(const Event& start) const {
        QF_CUDA_CHECK(cudaEventSynchronize(e_));
        float ms = 0.0f;
        QF_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
        return ms;
    }

  private:
    cudaEvent_t e_ = nullptr;
};

}  // namespace qforge::cuda
