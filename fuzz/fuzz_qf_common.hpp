// Builds a .qf file around a fuzzed header and data section: the preamble (offsets, lengths,
// header checksum) is computed here, so mutations reach the header's JSON and the tensor table
// instead of stopping at the checksum.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "core/hash.hpp"
#include "formats/qf_format.hpp"

namespace qforge::fuzz {

inline std::string assemble_qf(std::string_view header_json, std::string_view data_section) {
    QfPreamble p{};
    std::memcpy(p.magic, kQfMagic, sizeof kQfMagic);
    p.version = kQfVersion;
    p.endian_tag = kQfEndianTag;
    p.data_offset = kQfDataAlignment;
    p.data_length = data_section.size();
    p.header_offset = p.data_offset + p.data_length;
    p.header_length = header_json.size();
    const std::string tag =
        xxh3_64_tag({reinterpret_cast<const uint8_t*>(header_json.data()), header_json.size()});
    p.header_checksum = std::strtoull(tag.c_str() + std::strlen("xxh3-64:"), nullptr, 16);
    p.tensor_alignment = kQfTensorAlignment;
    std::string file(kQfDataAlignment, '\0');
    std::memcpy(file.data(), &p, sizeof p);
    file.append(data_section);
    file.append(header_json);
    return file;
}

}  // namespace qforge::fuzz
