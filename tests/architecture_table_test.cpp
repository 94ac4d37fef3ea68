// The architecture table (formats/architectures.hpp) as the one source of tensor facts: every row
// consistent with itself and with the other rows, so each input kind's names map back to exactly
// one of our tensors.
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>

#include "formats/architectures.hpp"
#include "quant/recipe.hpp"

namespace architecture_table_test {

using namespace qforge;

namespace {

constexpr Architecture kArchitectures[] = {Architecture::llama, Architecture::mistral,
                                           Architecture::qwen2, Architecture::qwen3};
// And those with a layout of their own (names only: no llama2.c form, Gemma's norms).
constexpr Architecture kAllArchitectures[] = {Architecture::llama,  Architecture::mistral,
                                              Architecture::qwen2,  Architecture::qwen3,
                                              Architecture::gemma2, Architecture::gemma3};

// Facts written out here from the formats' own definitions, not from the table: run.c's
// TransformerWeights fields (llama2.c has no biases; w1 gate, w3 up, w2 down), and each
// tensor's class.
struct Expected {
    std::string_view name_pattern;
    std::string_view llama2c_field;
    WeightClass cls;
    RopeRows rope;
};
constexpr Expected kExpected[] = {
    {"embed", "token_embedding_table", WeightClass::embedding, RopeRows::none},
    {"layers.{i}.attn_norm", "rms_att_weight", WeightClass::norm, RopeRows::none},
    {"layers.{i}.attn.q", "wq", WeightClass::attention_linear, RopeRows::q_heads},
    {"layers.{i}.attn.k", "wk", WeightClass::attention_linear, RopeRows::kv_heads},
    {"layers.{i}.attn.v", "wv", WeightClass::attention_linear, RopeRows::none},
    {"layers.{i}.attn.o", "wo", WeightClass::attention_linear, RopeRows::none},
    {"layers.{i}.attn.q_bias", "", WeightClass::bias, RopeRows::q_heads},
    {"layers.{i}.attn.k_bias", "", WeightClass::bias, RopeRows::kv_heads},
    {"layers.{i}.attn.v_bias", "", WeightClass::bias, RopeRows::none},
    {"layers.{i}.attn.q_norm", "", WeightClass::norm, RopeRows::none},
    {"layers.{i}.attn.k_norm", "", WeightClass::norm, RopeRows::none},
    {"layers.{i}.mlp_norm", "rms_ffn_weight", WeightClass::norm, RopeRows::none},
    {"layers.{i}.mlp.gate", "w1", WeightClass::mlp_linear, RopeRows::none},
    {"layers.{i}.mlp.up", "w3", WeightClass::mlp_linear, RopeRows::none},
    {"layers.{i}.mlp.down", "w2", WeightClass::mlp_linear, RopeRows::none},
    {"final_norm", "rms_final_weight", WeightClass::norm, RopeRows::none},
    {"lm_head", "wcls", WeightClass::output_head, RopeRows::none},
};

// The one row of `rows` whose `pattern` member matches `name`, with its layer; fails on none or
// several.
template <typename Member>
const TensorRow& unique_match(std::span<const TensorRow> rows, Member pattern,
                              const std::string& name, uint64_t& layer) {
    const TensorRow* found = nullptr;
    int matches = 0;
    for (const TensorRow& row : rows) {
        uint64_t l = 0;
        if (!match_tensor_pattern(row.*pattern, name, &l)) continue;
        ++matches;
        found = &row;
        layer = l;
    }
    INFO(name);
    REQUIRE(matches == 1);
    return *found;
}

}  // namespace

TEST_CASE("architecture table: every name round-trips to its row, in every naming", "[arch]") {
    for (Architecture arch : kAllArchitectures) {
        INFO(architecture_name(arch));
        const auto rows = tensor_rows(arch);
        for (const TensorRow& row : rows) {
            INFO(row.name_pattern);
            const bool layered = tensor_row_per_layer(row);
            // Each naming agrees on being per layer.
            REQUIRE((row.hf_pattern.find("{i}") != std::string_view::npos) == layered);
            REQUIRE((row.gguf_pattern.find("{i}") != std::string_view::npos) == layered);
            for (uint64_t layer : {uint64_t{0}, uint64_t{7}, uint64_t{123}}) {
                if (!layered && layer != 0) continue;
                for (auto pattern :
                     {&TensorRow::name_pattern, &TensorRow::hf_pattern, &TensorRow::gguf_pattern}) {
                    uint64_t back = 999;
                    const TensorRow& r = unique_match(
                        rows, pattern, tensor_name_for_layer(row.*pattern, layer), back);
                    REQUIRE(r.kind == row.kind);
                    if (layered) REQUIRE(back == layer);
                }
                // Our name alone, in any architecture, finds the same kind.
                uint64_t back = 999;
                const TensorRow* found =
                    find_tensor_row(tensor_name_for_layer(row.name_pattern, layer), &back);
                REQUIRE(found);
                REQUIRE(found->kind == row.kind);
            }
        }
        // Kinds, and each naming, are unique within the layout.
        std::set<TensorKind> kinds;
        std::set<std::string_view> ours, hf, gguf, llama2c;
        for (const TensorRow& row : rows) {
            REQUIRE(kinds.insert(row.kind).second);
            REQUIRE(ours.insert(row.name_pattern).second);
            REQUIRE(hf.insert(row.hf_pattern).second);
            REQUIRE(gguf.insert(row.gguf_pattern).second);
            if (!row.llama2c_field.empty()) REQUIRE(llama2c.insert(row.llama2c_field).second);
        }
        // Every kind but the sandwich-norm ones, which only Gemma's layout has.
        for (size_t k = 0; k <= static_cast<size_t>(TensorKind::lm_head); ++k)
            REQUIRE((kinds.count(TensorKind(k)) == 1 || tensor_kind_optional(TensorKind(k))));
    }
}

TEST_CASE("architecture table: llama2.c fields, classes, RoPE rows and precision", "[arch]") {
    for (Architecture arch : kArchitectures) {
        INFO(architecture_name(arch));
        const auto rows = tensor_rows(arch);
        REQUIRE(rows.size() == std::size(kExpected));
        for (const TensorRow& row : rows) {
            INFO(row.name_pattern);
            const Expected* e = nullptr;
            for (const auto& x : kExpected)
                if (x.name_pattern == row.name_pattern) e = &x;
            REQUIRE(e);
            REQUIRE(row.llama2c_field == e->llama2c_field);
            REQUIRE(row.cls == e->cls);
            REQUIRE(row.rope == e->rope);
            // Vectors are float only; matrices may take any row type.
            const bool vector = row.shape[1] == Dim::none;
            REQUIRE((weight_class_info(row.cls).least == LeastPrecision::float16) == vector);
        }
    }
    // Every class has its row in the class table, in enum order, with a name and a description.
    std::set<std::string_view> names;
    for (size_t i = 0; i < weight_classes().size(); ++i) {
        const WeightClassInfo& c = weight_classes()[i];
        REQUIRE(static_cast<size_t>(c.cls) == i);
        REQUIRE(names.insert(c.name).second);
        REQUIRE_FALSE(c.what.empty());
    }
}

TEST_CASE("the recipe classifies every tensor from the table's class", "[arch][quant]") {
    const std::map<WeightClass, TensorClass> untied = {
        {WeightClass::embedding, TensorClass::embed},
        {WeightClass::output_head, TensorClass::lm_head},
        {WeightClass::attention_linear, TensorClass::linear},
        {WeightClass::mlp_linear, TensorClass::linear},
        {WeightClass::norm, TensorClass::vector},
        {WeightClass::bias, TensorClass::vector}};
    ModelConfig c;
    c.vocab_size = 32;
    c.hidden_size = 8;
    c.intermediate_size = 16;
    c.num_layers = 2;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 4;
    c.attention_bias = true;
    c.tie_word_embeddings = false;
    for (const TensorSpec& s : expected_tensors(c)) {
        INFO(s.name);
        REQUIRE(classify_tensor(s.name, s.shape, false) == untied.at(s.row->cls));
        if (s.row->cls == WeightClass::embedding)
            REQUIRE(classify_tensor(s.name, s.shape, true) == TensorClass::tied_embed);
    }
}

}  // namespace architecture_table_test
