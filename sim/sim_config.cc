#include "sim/sim_config.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace coverage::sim {
namespace {

using nlohmann::json;

const char* const kDTypeNames[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i16", "i32", "i64", "bool", "c64", "c128"};

bool ReadWholeFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

std::string Where(const std::string& source, const std::string& key) { return source + ": key '" + key + "': "; }

std::string ParseRule(const json& j, const std::string& source, FaultRule* rule) {
  if (!j.is_object()) return source + ": a fault rule must be a JSON object, got " + j.dump();
  rule->source = source;
  for (const auto& [key, v] : j.items()) {
    const std::string at = Where(source, key);
    if (key == "op") {
      if (!v.is_string() || v.get<std::string>().empty()) return at + "expected an op name such as \"aten::mul.Tensor\", \"aten::mul\" or \"*\"";
      rule->op = v.get<std::string>();
      if (rule->op != "*" && rule->op.find("::") == std::string::npos) rule->op = "aten::" + rule->op;
    } else if (key == "dtype") {
      if (!v.is_string() || !IsKnownDTypeName(v.get<std::string>())) {
        return at + "expected one of f32 f64 f16 bf16 i8 u8 i16 i32 i64 bool c64 c128, got " + v.dump();
      }
      rule->dtype = v.get<std::string>();
    } else if (key == "shape") {
      if (!v.is_array()) return at + "expected an array of sizes such as [3, 4], got " + v.dump();
      std::vector<int64_t> shape;
      for (const auto& e : v) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0) return at + "expected non-negative integer sizes, got " + v.dump();
        shape.push_back(e.get<int64_t>());
      }
      rule->shape = shape;
    } else if (key == "dim") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) return at + "expected a non-negative integer, got " + v.dump();
      rule->dim = v.get<int64_t>();
    } else if (key == "attempts") {
      if (!v.is_array() || v.empty()) return at + "expected a non-empty array of attempt numbers such as [1], got " + v.dump();
      for (const auto& e : v) {
        if (!e.is_number_integer() || e.get<int64_t>() < 1) return at + "expected attempt numbers >= 1, got " + v.dump();
        rule->attempts.push_back(e.get<int64_t>());
      }
    } else if (key == "fault") {
      static const std::pair<const char*, FaultKind> kKinds[] = {
          {"wrong_values", FaultKind::kWrongValues}, {"nan", FaultKind::kNan},     {"unsupported", FaultKind::kUnsupported},
          {"error", FaultKind::kError},              {"crash", FaultKind::kCrash}, {"abort", FaultKind::kAbort},
          {"hang", FaultKind::kHang},                {"slow", FaultKind::kSlow}};
      bool found = false;
      for (const auto& [name, kind] : kKinds) {
        if (v.is_string() && v.get<std::string>() == name) {
          rule->fault = kind;
          found = true;
        }
      }
      if (!found) return at + "expected one of wrong_values nan unsupported error crash abort hang slow, got " + v.dump();
    } else if (key == "us") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 60'000'000) {
        return at + "expected microseconds, an integer from 0 to 60000000, got " + v.dump();
      }
      rule->slow_us = v.get<int64_t>();
    } else {
      return at + "unknown key (known: op dtype shape dim attempts fault us)";
    }
  }
  if (rule->op.empty()) return Where(source, "op") + "missing";
  if (!j.contains("fault")) return Where(source, "fault") + "missing";
  return "";
}

std::string ParseRules(const json& j, const std::string& source, std::vector<FaultRule>* rules) {
  if (!j.is_array()) return source + ": expected a JSON array of fault rules, got " + j.dump().substr(0, 200);
  for (size_t i = 0; i < j.size(); ++i) {
    FaultRule rule;
    if (std::string err = ParseRule(j[i], source + "[" + std::to_string(i) + "]", &rule); !err.empty()) return err;
    rules->push_back(std::move(rule));
  }
  return "";
}

}  // namespace

std::vector<std::string> Config::DefaultBf16Ops() {
  return {"aten::mm",     "aten::addmm",  "aten::bmm",    "aten::baddbmm", "aten::addbmm",
          "aten::matmul", "aten::addmv",  "aten::mv",     "aten::dot",     "aten::convolution",
          "aten::_convolution", "aten::convolution_overrideable", "aten::_grouped_mm"};
}

// "" and *out parsed, or nlohmann's reason with its line and column
// ("parse error at line 3, column 7: ..."), without the exception id.
std::string ParseJson(const std::string& text, json* out) {
  try {
    *out = json::parse(text);
    return "";
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos) {
      what.erase(0, what.find("] ") + 2);
    }
    return what;
  }
}

bool IsKnownDTypeName(const std::string& name) {
  for (const char* n : kDTypeNames) {
    if (name == n) return true;
  }
  return false;
}

std::string ParseConfig(const std::string& text, const std::string& source, Config* config) {
  json j;
  if (std::string error = ParseJson(text, &j); !error.empty()) return source + ": not valid JSON: " + error;
  if (!j.is_object()) return source + ": expected a JSON object";
  for (const auto& [key, v] : j.items()) {
    const std::string at = Where(source, key);
    if (key == "numerics") {
      if (v == "exact") {
        config->numerics = Numerics::kExact;
      } else if (v == "bf16_matmul") {
        config->numerics = Numerics::kBf16Matmul;
      } else {
        return at + "expected \"exact\" or \"bf16_matmul\", got " + v.dump();
      }
    } else if (key == "bf16_ops") {
      if (!v.is_array()) return at + "expected an array of op names, got " + v.dump();
      config->bf16_ops.clear();
      for (const auto& e : v) {
        if (!e.is_string() || e.get<std::string>().empty()) return at + "expected op names such as \"aten::mm\", got " + e.dump();
        std::string name = e.get<std::string>();
        config->bf16_ops.push_back(name.find("::") == std::string::npos ? "aten::" + name : name);
      }
    } else if (key == "compile_us") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 60'000'000) {
        return at + "expected microseconds, an integer from 0 to 60000000, got " + v.dump();
      }
      config->compile_us = v.get<int64_t>();
    } else if (key == "faults") {
      if (std::string err = ParseRules(v, source + ": key 'faults'", &config->faults); !err.empty()) return err;
    } else if (key.rfind("_", 0) == 0) {
      continue;  // "_comment" and friends
    } else {
      return at + "unknown key (known: numerics bf16_ops compile_us faults)";
    }
  }
  return "";
}

std::string ParseFaults(const std::string& text_or_path, const std::string& source, std::vector<FaultRule>* rules) {
  std::string text = text_or_path, where = source;
  if (!text.empty() && text[0] == '@') {
    const std::string path = text.substr(1);
    where = source + "=@" + path;
    if (!ReadWholeFile(path, &text)) return where + ": cannot read the file";
  }
  json j;
  if (std::string error = ParseJson(text, &j); !error.empty()) {
    return where + ": not valid JSON (expected an array of fault rules): " + error;
  }
  return ParseRules(j, where, rules);
}

std::string ConfigFromEnvironment(Config* config) {
  *config = Config{};
  if (const char* path = std::getenv("COVERAGE_SIM_CONFIG"); path && *path) {
    const std::string source = std::string("COVERAGE_SIM_CONFIG=") + path;
    std::string text;
    if (!ReadWholeFile(path, &text)) return source + ": cannot read the file";
    if (std::string err = ParseConfig(text, source, config); !err.empty()) return err;
  }
  if (const char* faults = std::getenv("COVERAGE_SIM_FAULTS"); faults && *faults) {
    if (std::string err = ParseFaults(faults, "COVERAGE_SIM_FAULTS", &config->faults); !err.empty()) return err;
  }
  return "";
}

}  // namespace coverage::sim
