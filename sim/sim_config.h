// Configuration of the simulated PrivateUse1 device (sim/README.md): what
// numerics it imitates, how long a simulated compilation takes, and which
// faults it injects. Parsed from JSON; nothing here touches torch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace coverage::sim {

enum class Numerics {
  kExact,       // every op computes exactly what ATen's CPU kernel computes
  kBf16Matmul,  // fp32 operands of matmul-like ops are rounded to bf16 first (fp32 accumulation)
};

enum class FaultKind { kWrongValues, kNan, kUnsupported, kError, kCrash, kAbort, kHang, kSlow };

// One fault rule. An op matches when every given condition holds; see
// Note [Sim fault matching] in sim_faults.cc.
struct FaultRule {
  std::string op;                             // "aten::mul.Tensor", "aten::mul" (every overload) or "*"
  std::optional<std::string> dtype;           // dtype of the first tensor argument: "f32", "bf16", "i64", ...
  std::optional<std::vector<int64_t>> shape;  // exact shape of the first tensor argument
  std::optional<int64_t> dim;                 // some dimension of the first tensor argument equals it
  std::vector<int64_t> attempts;              // fires only when $COVERAGE_ATTEMPT (default 1) is listed; empty: always
  FaultKind fault = FaultKind::kError;
  int64_t slow_us = 1000;                     // kSlow: how long each matching call sleeps first
  std::string source;                         // where the rule came from, for messages: "COVERAGE_SIM_FAULTS[0]"
};

struct Config {
  Numerics numerics = Numerics::kExact;
  // Ops whose fp32 operands are rounded to bf16 under kBf16Matmul (qualified
  // names; a bare name covers every overload).
  std::vector<std::string> bf16_ops = DefaultBf16Ops();
  int64_t compile_us = 0;  // time a simulated compilation takes (slept on the first call of a signature)
  std::vector<FaultRule> faults;

  static std::vector<std::string> DefaultBf16Ops();
};

// Parses a configuration file's text. `source` names it in errors
// ("COVERAGE_SIM_CONFIG=/x/sim.json"). Returns an error message naming the
// source and the key, or "" on success.
std::string ParseConfig(const std::string& text, const std::string& source, Config* config);

// Parses fault rules: a JSON array, given inline or as "@/path/file.json".
// `source` names the environment variable in errors. Rules are appended.
std::string ParseFaults(const std::string& text_or_path, const std::string& source, std::vector<FaultRule>* rules);

// The configuration the environment describes: $COVERAGE_SIM_CONFIG (a file;
// unset: the defaults above) plus the rules of $COVERAGE_SIM_FAULTS.
std::string ConfigFromEnvironment(Config* config);

// True for the dtype names rules use: f32 f64 f16 bf16 i8 u8 i16 i32 i64 bool c64 c128.
bool IsKnownDTypeName(const std::string& name);

}  // namespace coverage::sim
