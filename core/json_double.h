// Doubles in JSON, including the values JSON has no numbers for: inf, -inf
// and nan are written as the strings "inf", "-inf" and "nan".
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace coverage {

nlohmann::json DoubleToJson(double v);
// nullopt when `j` is neither a number nor one of the three strings.
std::optional<double> DoubleFromJson(const nlohmann::json& j);

// Compact JSON text that never throws on strings that are not valid UTF-8
// (a backend's error text, a worker's last output): such bytes become U+FFFD.
inline std::string DumpJson(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace coverage
