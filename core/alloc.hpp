// Buffers sized by a file's contents. A failed allocation is an Error naming the file and the
// tensor whose buffer it was, with the size asked for, never a bare std::bad_alloc or the
// library's "vector::_M_default_append".
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "core/error.hpp"

namespace qforge {

template <class Vector>
void resize_for(Vector& v, uint64_t count, const std::string& file, const std::string& tensor) {
    const auto fail = [&] {
        return Error(file, tensor,
                     "cannot allocate " + std::to_string(count) + " elements of " +
                         std::to_string(sizeof(typename Vector::value_type)) +
                         " bytes for it: out of memory");
    };
    if (count > std::numeric_limits<size_t>::max() / sizeof(typename Vector::value_type))
        throw fail();
    try {
        v.resize(static_cast<size_t>(count));
    } catch (const std::bad_alloc&) {
        throw fail();
    } catch (const std::length_error&) {
        throw fail();
    }
}

// Runs `f`, turning an allocation failure anywhere inside into an Error naming `file`: the
// backstop for buffers that no reader sized by a single tensor.
template <class F>
decltype(auto) naming_file_on_bad_alloc(const std::string& file, F&& f) {
    try {
        return f();
    } catch (const std::bad_alloc&) {
        throw Error(file, {}, "out of memory while reading it");
    } catch (const std::length_error&) {
        throw Error(file, {},
                    "out of memory while reading it (a size exceeds what can be allocated)");
    }
}

// A buffer for weights a kernel streams through, 64-byte aligned; 2 MiB or more in 2 MiB-aligned
// memory advised for huge pages (one TLB entry per 2 MiB of a stream). An Error naming `what`
// and the size when it cannot be allocated.
inline constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;
struct FreeAligned {
    void operator()(uint8_t* p) const;
};
using AlignedBytes = std::unique_ptr<uint8_t[], FreeAligned>;
AlignedBytes stream_buffer(uint64_t bytes, const std::string& what);

}  // namespace qforge
