#include "convert/convert_common.hpp"

namespace qforge {

using nlohmann::json;

json convert_provenance(json sources, const ConvertOptions& options, const json& recipe_extra) {
    json recipe = {
        {"command", "convert"},
        {"dtype", options.dtype ? std::string(qtype_traits(*options.dtype).name) : "source"},
        {"compress", options.compress}};
    recipe.update(recipe_extra);
    return {
        {"generator", {{"name", "qforge"}, {"version", QFORGE_VERSION}}},
        {"sources", std::move(sources)},
        {"recipe", std::move(recipe)},
    };
}

QType target_qtype(std::span<const uint64_t> shape, QType source,
                   const std::optional<QType>& requested) {
    if (!requested) return source;
    if (shape.size() < 2) return QType::f32;
    return *requested;
}

}  // namespace qforge
