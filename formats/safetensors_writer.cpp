// Writing safetensors files. The header is laid out exactly as the reference implementation
// writes it (compact JSON, "__metadata__" first, keys dtype/shape/data_offsets in that order,
// spaces up to a multiple of 8), so for the same tensor order the bytes are identical.
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.hpp"
#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "formats/safetensors.hpp"

namespace qforge {

namespace {

// Insertion-ordered JSON: the order of keys is part of the byte layout we promise.
using ordered_json = nlohmann::ordered_json;

ordered_json header_json(const std::string& path, std::span<const TensorView> tensors,
                         const std::map<std::string, std::string>& metadata) {
    ordered_json header = ordered_json::object();
    if (!metadata.empty()) {
        ordered_json meta = ordered_json::object();
        for (const auto& [key, value] : metadata) meta[key] = value;
        header["__metadata__"] = std::move(meta);
    }
    std::set<std::string_view> names;
    uint64_t offset = 0;
    for (const TensorView& t : tensors) {
        if (t.name == "__metadata__")
            throw Error(path, t.name, "this name is reserved for the header's metadata");
        if (!names.insert(t.name).second) throw Error(path, t.name, "name given twice");
        const DTypeInfo& info = dtype_info(t.dtype);
        const auto elements = checked_product(t.shape);
        const auto needed = elements ? checked_mul(*elements, info.size) : std::nullopt;
        if (!needed || *needed != t.data.size())
            throw Error(path, t.name,
                        "has " + std::to_string(t.data.size()) + " bytes but shape " +
                            shape_to_string(t.shape) + " of " + std::string(info.safetensors_name) +
                            " needs " +
                            (needed ? std::to_string(*needed) : std::string("more than 2^64")));
        const auto end = checked_add(offset, *needed);
        if (!end) throw Error(path, t.name, "data section would exceed 2^64 bytes");
        header[t.name] = {
            {"dtype", info.safetensors_name}, {"shape", t.shape}, {"data_offsets", {offset, *end}}};
        offset = *end;
    }
    return header;
}

}  // namespace

void write_safetensors(const std::string& path, std::span<const TensorView> tensors,
                       const std::map<std::string, std::string>& metadata) {
    std::string text;
    try {
        text = header_json(path, tensors, metadata).dump();
    } catch (const nlohmann::json::exception& e) {
        // dump() refuses strings that are not UTF-8, which the format requires of names.
        throw Error(path, {}, std::string("cannot encode the header: ") + e.what());
    }
    text.append((8 - text.size() % 8) % 8, ' ');
    if (text.size() > kSafetensorsMaxHeaderBytes)
        throw Error(path, {},
                    "header of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                        std::to_string(kSafetensorsMaxHeaderBytes) + " that readers enforce");

    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(text.size() >> (8 * i));

    AtomicFile out(path);
    out.write(length, sizeof length);
    out.write(text.data(), text.size());
    for (const TensorView& t : tensors)
        if (!t.data.empty()) out.write(t.data);
    out.commit();
}

}  // namespace qforge
