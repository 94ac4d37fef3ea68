#include "quant/resume_state.hpp"

#include <zstd.h>

#include <bit>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "formats/json_io.hpp"
#include "formats/zstd_frame.hpp"

namespace qforge {

namespace {

static_assert(std::endian::native == std::endian::little, "state files are little-endian");

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kMagic[8] = {'Q', 'F', 'S', 'T', 'A', 'T', 'E', '\0'};
constexpr int kZstdLevel = 3;
constexpr const char* kRunFormat = "qforge-resume";
constexpr int kRunVersion = 1;

// The path of the first value that differs between two fingerprints ("recipe.qtype").
std::string first_difference(const json& a, const json& b, const std::string& path) {
    if (a == b) return {};
    auto join = [&](const std::string& k) { return path.empty() ? k : path + "." + k; };
    if (a.is_object() && b.is_object()) {
        for (const auto& [k, v] : a.items()) {
            if (!b.contains(k)) return join(k);
            if (auto d = first_difference(v, b.at(k), join(k)); !d.empty()) return d;
        }
        for (const auto& [k, v] : b.items())
            if (!a.contains(k)) return join(k);
    }
    if (a.is_array() && b.is_array() && a.size() == b.size())
        for (size_t i = 0; i < a.size(); ++i)
            if (auto d = first_difference(a[i], b[i], path + "[" + std::to_string(i) + "]");
                !d.empty())
                return d;
    return path.empty() ? "fingerprint" : path;
}

const json* at_path(const json& j, const std::string& path) {
    const json* cur = &j;
    size_t pos = 0;
    while (pos < path.size()) {
        size_t end = path.find_first_of(".[", pos);
        std::string key =
            path.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
        if (!key.empty()) {
            if (!cur->is_object() || !cur->contains(key)) return nullptr;
            cur = &cur->at(key);
        }
        if (end == std::string::npos) break;
        if (path[end] == '[') {
            const size_t close = path.find(']', end);
            // The path came from first_difference over a hostile record: its keys may hold
            // '.' or '[', so an index that does not parse just means "not found".
            size_t i = 0;
            const char* first = path.data() + end + 1;
            const char* last =
                close == std::string::npos ? path.data() + path.size() : path.data() + close;
            if (close == std::string::npos || std::from_chars(first, last, i).ptr != last)
                return nullptr;
            if (!cur->is_array() || i >= cur->size()) return nullptr;
            cur = &cur->at(i);
            pos = close + 1;
            if (pos < path.size() && path[pos] == '.') ++pos;
        } else {
            pos = end + 1;
        }
    }
    return cur;
}

std::string short_value(const json* v) {
    if (!v) return "absent";
    std::string s = v->dump();
    return s.size() <= 48 ? s : s.substr(0, 45) + "...";
}

std::vector<uint8_t> compress(std::span<const uint8_t> raw, const std::string& path) {
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    if (!cctx) throw Error(path, {}, "zstd: out of memory");
    std::vector<uint8_t> out(ZSTD_compressBound(raw.size()));
    size_t n = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, kZstdLevel);
    if (!ZSTD_isError(n)) n = ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    if (!ZSTD_isError(n)) n = ZSTD_compress2(cctx, out.data(), out.size(), raw.data(), raw.size());
    ZSTD_freeCCtx(cctx);
    if (ZSTD_isError(n))
        throw Error(path, {}, std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
    out.resize(n);
    return out;
}

void write_section(AtomicFile& f, StateSectionKind kind, uint64_t index,
                   std::span<const uint8_t> raw) {
    const std::vector<uint8_t> stored = compress(raw, f.final_path());
    StateSection s{};
    s.kind = static_cast<uint32_t>(kind);
    s.index = index;
    s.raw_bytes = raw.size();
    s.stored_bytes = stored.size();
    f.write(&s, sizeof s);
    f.write(stored);
}

}  // namespace

ResumeDir::ResumeDir(std::string dir, const json& fingerprint, uint64_t num_layers)
    : dir_(std::move(dir)) {
    // Only DIR itself is made: a missing parent is refused before any work
    // (core/output_path.hpp's check_state_dir), as a mistyped path should be.
    std::error_code ec;
    fs::create_directory(dir_, ec);
    if (ec || !fs::is_directory(dir_))
        throw Error(dir_, {}, "cannot create the --resume directory: " + ec.message());
    const std::string run = (fs::path(dir_) / "run.json").string();
    const json expected = {
        {"format", kRunFormat}, {"version", kRunVersion}, {"fingerprint", fingerprint}};
    if (fs::exists(run)) {
        json found;
        try {
            found = read_json_file(run);
        } catch (const Error& e) {
            throw Error(run, {},
                        "not a qforge --resume run record (" + e.detail() +
                            "; use another --resume directory)");
        }
        if (!found.is_object() || found.value("format", json()) != kRunFormat ||
            !found.contains("fingerprint") || !found.contains("version"))
            throw Error(run, {},
                        "not a qforge --resume run record (use another --resume directory)");
        if (found.at("version") != kRunVersion)
            throw Error(run, {},
                        "written by another qforge version of the resume format (" +
                            found.at("version").dump() + "; this one reads " +
                            std::to_string(kRunVersion) + "): use another --resume directory");
        const json& theirs = found.at("fingerprint");
        const std::string d = first_difference(theirs, fingerprint, "");
        if (!d.empty())
            throw Error(dir_, {},
                        "holds the state of a different run: its " + d + " differs (" +
                            short_value(at_path(theirs, d)) + " there, " +
                            short_value(at_path(fingerprint, d)) +
                            " here); use another --resume directory");
    } else {
        AtomicFile f(run);
        const std::string text = expected.dump(2) + "\n";
        f.write(text.data(), text.size());
        f.commit();
    }

    // The finished blocks: block-NNNN.qfstate, every index below the highest present.
    int64_t highest = -1;
    for (const auto& e : fs::directory_iterator(dir_)) {
        const std::string name = e.path().filename().string();
        const std::string prefix = "block-", suffix = ".qfstate";
        if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
            continue;  // run.json, temporaries of an interrupted write
        const std::string digits =
            name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
        if (digits.size() > 12 || digits.find_first_not_of("0123456789") != std::string::npos)
            continue;
        const uint64_t n = std::stoull(digits);
        if (name == fs::path(block_path(n)).filename().string())
            highest = std::max<int64_t>(highest, static_cast<int64_t>(n));
    }
    if (highest >= static_cast<int64_t>(num_layers))
        throw Error(block_path(static_cast<uint64_t>(highest)), {},
                    "the model has only " + std::to_string(num_layers) + " blocks");
    for (int64_t i = 0; i < highest; ++i)
        if (!fs::exists(block_path(static_cast<uint64_t>(i))))
            throw Error(block_path(static_cast<uint64_t>(i)), {},
                        "missing, though block " + std::to_string(highest) +
                            " is saved (use another --resume directory)");
    blocks_done_ = static_cast<uint64_t>(highest + 1);
}

std::string ResumeDir::block_path(uint64_t layer) const {
    char name[40];
    std::snprintf(name, sizeof name, "block-%04llu.qfstate",
                  static_cast<unsigned long long>(layer));
    return (fs::path(dir_) / name).string();
}

void ResumeDir::save(const BlockState& state) const {
    AtomicFile f(block_path(state.layer));
    StateFileHeader h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kStateFileVersion;
    h.sections = static_cast<uint32_t>(2 + state.tensors.size());
    h.layer = state.layer;
    f.write(&h, sizeof h);
    const std::vector<uint8_t> meta = json::to_cbor(state.meta);
    write_section(f, StateSectionKind::meta, 0, meta);
    write_section(f, StateSectionKind::hidden, 0,
                  {reinterpret_cast<const uint8_t*>(state.hidden.data()),
                   state.hidden.size() * sizeof(float)});
    for (const auto& [i, bytes] : state.tensors)
        write_section(f, StateSectionKind::tensor, i, bytes);
    f.commit();
}

BlockState ResumeDir::load(uint64_t layer, bool want_hidden, bool want_tensors) const {
    const std::string path = block_path(layer);
    auto bad = [&](const std::string& why) {
        return Error(path, {}, why + " (delete it to recompute the block)");
    };
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) throw Error(path, {}, "cannot read the block state: " + ec.message());
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path, {}, "cannot open the block state");
    uint64_t pos = 0;
    auto read = [&](void* dst, uint64_t n, const char* what) {
        if (n > size - pos)
            throw bad(std::string("truncated block state: ") + what + " ends past the file's " +
                      std::to_string(size) + " bytes");
        in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
        if (!in) throw bad(std::string("read failed in ") + what);
        pos += n;
    };
    StateFileHeader h{};
    read(&h, sizeof h, "the header");
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0)
        throw bad("not a qforge block state (bad magic)");
    if (h.version != kStateFileVersion)
        throw bad("block state version " + std::to_string(h.version) + "; this qforge reads " +
                  std::to_string(kStateFileVersion));
    if (h.layer != layer)
        throw bad("holds block " + std::to_string(h.layer) + ", not " + std::to_string(layer));

    BlockState st;
    st.layer = layer;
    bool have_meta = false, have_hidden = false;
    std::vector<uint8_t> stored;
    for (uint32_t k = 0; k < h.sections; ++k) {
        StateSection s{};
        read(&s, sizeof s, "a section header");
        if (s.stored_bytes > size - pos)
            throw bad("truncated block state: section " + std::to_string(k) +
                      " ends past the file's " + std::to_string(size) + " bytes");
        const auto kind = static_cast<StateSectionKind>(s.kind);
        const bool wanted = kind == StateSectionKind::meta ||
                            (kind == StateSectionKind::hidden && want_hidden) ||
                            (kind == StateSectionKind::tensor && want_tensors);
        if (kind != StateSectionKind::meta && kind != StateSectionKind::hidden &&
            kind != StateSectionKind::tensor)
            throw bad("unknown section kind " + std::to_string(s.kind));
        if (!wanted) {
            in.seekg(static_cast<std::streamoff>(s.stored_bytes), std::ios::cur);
            pos += s.stored_bytes;
            continue;
        }
        stored.resize(s.stored_bytes);
        read(stored.data(), s.stored_bytes, "a section");
        std::vector<uint8_t> raw;
        try {
            zstd_decode_exact(stored, s.raw_bytes, {}, {}, raw);
        } catch (const Error& e) {
            throw bad("damaged block state: section " + std::to_string(k) + ": " + e.detail());
        }
        if (kind == StateSectionKind::meta) {
            try {
                st.meta = parse_cbor(raw, path, "meta section");
            } catch (const Error& e) {
                throw bad("damaged block state: " + e.detail());
            }
            if (!st.meta.is_object())
                throw bad("damaged block state: its meta section is not a CBOR object");
            have_meta = true;
        } else if (kind == StateSectionKind::hidden) {
            if (raw.size() % sizeof(float) != 0)
                throw bad("damaged block state: hidden states are not float32");
            st.hidden.resize(raw.size() / sizeof(float));
            std::memcpy(st.hidden.data(), raw.data(), raw.size());
            have_hidden = true;
        } else {
            st.tensors[s.index] = std::move(raw);
        }
    }
    if (pos != size) throw bad(std::to_string(size - pos) + " bytes after the last section");
    if (!have_meta) throw bad("damaged block state: no meta section");
    if (want_hidden && !have_hidden) throw bad("damaged block state: no hidden states");
    return st;
}

}  // namespace qforge
