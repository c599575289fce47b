// Doubles in JSON, including the values JSON has no numbers for: inf, -inf
// and nan are written as the strings "inf", "-inf" and "nan".
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

namespace coverage {

nlohmann::json DoubleToJson(double v);
// nullopt when `j` is neither a number nor one of the three strings.
std::optional<double> DoubleFromJson(const nlohmann::json& j);

}  // namespace coverage
