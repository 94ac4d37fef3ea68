// Hand-made GGUF files for tests: a description (metadata pairs and tensors) assembled into the
// bytes of a version 3 file, so a test can write a valid file and then break one field of it.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qforge::test {

// Little-endian appends.
inline void put_u32(std::vector<uint8_t>& b, uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void put_u64(std::vector<uint8_t>& b, uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void put_str(std::vector<uint8_t>& b, std::string_view s) {
    put_u64(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
}

// GGUF value type ids (formats/gguf.hpp's GgufValueType).
enum : uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kStr, kArr, kU64, kI64, kF64 };

struct TestKv {
    std::string key;
    uint32_t type;
    std::vector<uint8_t> payload;  // the encoded value after the type
};

inline TestKv kv_u32(std::string key, uint32_t v) {
    TestKv kv{std::move(key), kU32, {}};
    put_u32(kv.payload, v);
    return kv;
}
inline TestKv kv_f32(std::string key, float v) {
    TestKv kv{std::move(key), kF32, {}};
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    put_u32(kv.payload, bits);
    return kv;
}
inline TestKv kv_bool(std::string key, bool v) {
    return {std::move(key), kBool, {static_cast<uint8_t>(v)}};
}
inline TestKv kv_str(std::string key, std::string_view v) {
    TestKv kv{std::move(key), kStr, {}};
    put_str(kv.payload, v);
    return kv;
}
inline TestKv kv_str_array(std::string key, const std::vector<std::string>& v) {
    TestKv kv{std::move(key), kArr, {}};
    put_u32(kv.payload, kStr);
    put_u64(kv.payload, v.size());
    for (const auto& s : v) put_str(kv.payload, s);
    return kv;
}
inline TestKv kv_i32_array(std::string key, const std::vector<int32_t>& v) {
    TestKv kv{std::move(key), kArr, {}};
    put_u32(kv.payload, kI32);
    put_u64(kv.payload, v.size());
    for (int32_t x : v) put_u32(kv.payload, static_cast<uint32_t>(x));
    return kv;
}

struct TestTensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;                   // ggml type id
    std::vector<uint8_t> data;       // written at `offset` in the data section
    std::optional<uint64_t> offset;  // default: after the previous tensor, aligned
};

struct TestGguf {
    char magic[4] = {'G', 'G', 'U', 'F'};
    uint32_t version = 3;
    std::optional<uint64_t> tensor_count, kv_count;  // override the true counts
    std::vector<TestKv> kvs;
    std::vector<TestTensor> tensors;
    uint64_t alignment = 32;  // used to place the data section and default offsets

    std::vector<uint8_t> bytes() const {
        std::vector<uint8_t> b(magic, magic + 4);
        put_u32(b, version);
        put_u64(b, tensor_count.value_or(tensors.size()));
        put_u64(b, kv_count.value_or(kvs.size()));
        for (const auto& kv : kvs) {
            put_str(b, kv.key);
            put_u32(b, kv.type);
            b.insert(b.end(), kv.payload.begin(), kv.payload.end());
        }
        std::vector<uint64_t> offsets;
        uint64_t next = 0;
        for (const auto& t : tensors) {
            const uint64_t off = t.offset.value_or(next);
            offsets.push_back(off);
            next = (off + t.data.size() + alignment - 1) / alignment * alignment;
            put_str(b, t.name);
            put_u32(b, static_cast<uint32_t>(t.ne.size()));
            for (uint64_t d : t.ne) put_u64(b, d);
            put_u32(b, t.type);
            put_u64(b, off);
        }
        b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
        const size_t data = b.size();
        for (size_t i = 0; i < tensors.size(); ++i) {
            if (tensors[i].data.empty()) continue;
            const size_t end = data + offsets[i] + tensors[i].data.size();
            if (b.size() < end) b.resize(end, 0);
            std::memcpy(b.data() + data + offsets[i], tensors[i].data.data(),
                        tensors[i].data.size());
        }
        return b;
    }
};

// f32 values as bytes.
inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

}  // namespace qforge::test
