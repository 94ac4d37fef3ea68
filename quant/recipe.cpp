#include "quant/recipe.hpp"

#include <cstdio>

#include "core/error.hpp"
#include "formats/architectures.hpp"

namespace qforge {

namespace {

// How a class of tensor gets its type when no override applies.
enum class Rule : uint8_t {
    f32,           // always f32
    default_type,  // the recipe's type
    output_head,   // the recipe's type, but at least 8 bits (kOutputHeadQType below that)
};

struct ClassPolicy {
    TensorClass cls;
    std::string_view name;  // as reports and the .qf header spell it
    Rule rule;
    std::string_view why;  // the start of the reason a report gives
};

// The default policy, one row per class (recipe.hpp explains each choice).
constexpr ClassPolicy kClassPolicies[] = {
    {TensorClass::vector, "vector", Rule::f32,
     "1-D (norms, biases): f32, exact for every float source"},
    {TensorClass::embed, "embed", Rule::default_type, "untied embedding (a row lookup)"},
    {TensorClass::tied_embed, "tied_embed", Rule::output_head,
     "tied embedding, which also serves as the output head"},
    {TensorClass::lm_head, "lm_head", Rule::output_head, "output head"},
    {TensorClass::linear, "linear", Rule::default_type, "linear layer"},
};
static_assert(std::size(kClassPolicies) == static_cast<size_t>(TensorClass::linear) + 1,
              "every TensorClass needs a policy row");

constexpr bool policies_in_enum_order() {
    for (size_t i = 0; i < std::size(kClassPolicies); ++i)
        if (static_cast<size_t>(kClassPolicies[i].cls) != i) return false;
    return true;
}
static_assert(policies_in_enum_order(), "kClassPolicies rows must follow the enum order");

const ClassPolicy& policy_of(TensorClass c) { return kClassPolicies[static_cast<size_t>(c)]; }

// Whether a tensor of this shape can be stored as `t`: quantized rows need a matrix.
bool storable(QType t, std::span<const uint64_t> shape) {
    return !qtype_is_quantized(t) || (shape.size() == 2 && shape[1] > 0 && shape[0] > 0);
}

std::string fixed(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", v);
    return buf;
}

}  // namespace

std::string qtype_names() {
    std::string s;
    for (const auto& row : kQTypes) {
        if (!s.empty()) s += ", ";
        s += row.name;
    }
    return s;
}

QuantMethod parse_quant_method(std::string_view name) {
    for (const auto& m : kQuantMethods) {
        if (m.name != name) continue;
        if (!m.implemented)
            throw Error("--method " + std::string(name) +
                        ": not implemented yet (it needs calibration data and a later qforge; "
                        "use --method rtn)");
        return m.method;
    }
    std::string valid;
    for (const auto& m : kQuantMethods) valid += (valid.empty() ? "" : ", ") + std::string(m.name);
    throw Error("--method '" + std::string(name) + "' is not a method (valid: " + valid + ")");
}

std::string qtype_family_names() {
    std::string s;
    for (const auto& f : kQTypeFamilies)
        s += (s.empty() ? "" : ", ") + std::string(f.name) + " = " +
             std::string(qtype_traits(f.member).name);
    return s;
}

QType parse_qtype_name(std::string_view name, std::string_view what) {
    if (auto t = qtype_from_name(name)) return *t;
    for (const auto& f : kQTypeFamilies)
        if (f.name == name) return f.member;
    throw Error(std::string(what) + ": unknown qtype '" + std::string(name) +
                "' (valid: " + qtype_names() + "; families: " + qtype_family_names() + ")");
}

TensorTypeOverride parse_tensor_type_override(const std::string& spec) {
    // The last '=' splits, so a regex may itself contain '=' (type names never do).
    const size_t eq = spec.rfind('=');
    if (eq == std::string::npos)
        throw Error("--tensor-type '" + spec + "': expected REGEX=TYPE, e.g. 'mlp\\.down=q8_g32'");
    const std::string pattern = spec.substr(0, eq);
    if (pattern.empty()) throw Error("--tensor-type '" + spec + "': the regex before '=' is empty");
    const QType t =
        parse_qtype_name(std::string_view(spec).substr(eq + 1), "--tensor-type '" + spec + "'");
    try {
        return {spec, std::regex(pattern, std::regex::ECMAScript), t};
    } catch (const std::regex_error& e) {
        throw Error("--tensor-type '" + spec + "': bad regex '" + pattern + "': " + e.what());
    }
}

std::string_view tensor_class_name(TensorClass c) { return policy_of(c).name; }

TensorClass classify_tensor(std::string_view name, std::span<const uint64_t> shape, bool tied) {
    // The architecture table's class of the tensor; a name outside the table (only in tests:
    // every .qf is validated against it) by its shape.
    const TensorRow* row = find_tensor_row(name);
    if (!row) return shape.size() == 2 ? TensorClass::linear : TensorClass::vector;
    switch (row->cls) {
        case WeightClass::norm:
        case WeightClass::bias:
            return TensorClass::vector;
        case WeightClass::embedding:
            return tied ? TensorClass::tied_embed : TensorClass::embed;
        case WeightClass::output_head:
            return TensorClass::lm_head;
        case WeightClass::attention_linear:
        case WeightClass::mlp_linear:
            break;
    }
    return TensorClass::linear;
}

TensorChoice choose_tensor_qtype(const QuantRecipe& recipe, std::string_view name,
                                 std::span<const uint64_t> shape, QType source, bool tied) {
    TensorChoice c;
    c.cls = classify_tensor(name, shape, tied);
    const std::string name_s(name);
    for (size_t i = 0; i < recipe.overrides.size(); ++i) {
        const TensorTypeOverride& o = recipe.overrides[i];
        if (!storable(o.qtype, shape) || !std::regex_search(name_s, o.regex)) continue;
        c.qtype = o.qtype;
        c.override_index = static_cast<int>(i);
        c.reason = "--tensor-type " + o.text;
        return c;
    }

    const ClassPolicy& p = policy_of(c.cls);
    const QTypeTraits& def = qtype_traits(recipe.qtype);
    switch (p.rule) {
        case Rule::f32:
            c.qtype = QType::f32;
            c.reason = std::string(p.why);
            return c;
        case Rule::default_type:
            c.qtype = recipe.qtype;
            c.reason = std::string(p.why) + ": the default type";
            break;
        case Rule::output_head:
            if (!def.is_float && def.bits < 8) {
                c.qtype = kOutputHeadQType;
                c.reason = std::string(p.why) + ": " +
                           std::string(qtype_traits(kOutputHeadQType).name) +
                           ", at least 8 bits (its error moves every logit)";
            } else {
                c.qtype = recipe.qtype;
                c.reason = std::string(p.why) + ": the default type";
            }
            break;
    }

    // The size rule: quantize only where the packed row is smaller than the float one. Rows are
    // counted padded to 64 bytes, as the rule was defined before rows were packed tight (format
    // version 2), so the type a short-rowed tensor gets did not change with the layout.
    if (qtype_is_quantized(c.qtype) && !qtype_is_quantized(source)) {
        const uint64_t k = shape[1];
        const double packed = qtype_bits_per_weight(c.qtype, k, kQfV1RowAlign);
        const double plain = qtype_traits(source).bits;
        if (packed >= plain) {
            c.reason = std::string(p.why) + ": rows of " + std::to_string(k) +
                       " weights would take " + fixed(packed) + " bits per weight as " +
                       std::string(qtype_traits(c.qtype).name) + ", no fewer than as " +
                       std::string(qtype_traits(source).name) + "; kept " +
                       std::string(qtype_traits(source).name);
            c.qtype = source;
        }
    }
    return c;
}

nlohmann::json recipe_to_json(const QuantRecipe& recipe) {
    nlohmann::json overrides = nlohmann::json::array();
    for (const auto& o : recipe.overrides) overrides.push_back(o.text);
    return {{"method", quant_method_info(recipe.method).name},
            {"qtype", qtype_traits(recipe.qtype).name},
            {"overrides", std::move(overrides)}};
}

}  // namespace qforge
