#include "core/alloc.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

namespace qforge {

namespace {
constexpr uint64_t kLine = 64;
constexpr uint64_t kHugePage = kHugePageBytes;
}  // namespace

void FreeAligned::operator()(uint8_t* p) const { std::free(p); }

AlignedBytes stream_buffer(uint64_t bytes, const std::string& what) {
    const uint64_t align = bytes >= kHugePage ? kHugePage : kLine;
    const uint64_t size = (std::max<uint64_t>(bytes, 1) + align - 1) / align * align;
    AlignedBytes p(static_cast<uint8_t*>(std::aligned_alloc(align, size)));
    if (!p) throw Error(what + ": out of memory for " + std::to_string(bytes) + " bytes");
#if defined(MADV_HUGEPAGE)
    if (align == kHugePage) ::madvise(p.get(), size, MADV_HUGEPAGE);
#endif
    return p;
}

}  // namespace qforge
