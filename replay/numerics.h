// DeclaredNumerics: how a backend says it computes, so that it is judged
// against that and not against exact fp32 (Note [Declared numerics] in
// numerics.cc). Trainium's compiler casts fp32 matmul operands to bf16 by
// default, CUDA offers TF32, sim's bf16_matmul does the same: judged at fp32
// tolerance every model would fail for a choice the backend made on purpose.
// Torch-free (the reference applies it, replay/call_engine.h).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace coverage::replay {

struct DeclaredNumerics {
  // What an fp32 operand of a declared op is rounded to before the op
  // computes (accumulating in fp32, as the CPU kernel then does).
  enum class Rounding { kBf16, kTf32 };
  Rounding fp32_operands = Rounding::kBf16;
  // Declared ops by name ("aten::mm"; every overload) -> the operands
  // rounded, by schema argument name; empty: every fp32 tensor argument the
  // op only reads.
  std::map<std::string, std::vector<std::string>, std::less<>> ops;
  std::string source;  // where the declaration came from (a file, "the backend"); "" when none
  std::string text;    // the declaration as given, for workers and the run's record

  bool empty() const { return ops.empty(); }
  // The operands `op` ("aten::mm", bare) rounds, or null when it is not declared.
  const std::vector<std::string>* OperandsOf(std::string_view op) const;
  // "fp32 operands rounded to bf16 in 12 ops (aten::mm, aten::addmm, ...)", or "exact fp32".
  std::string Summary() const;
  static std::string_view RoundingName(Rounding r);

  // Parses a declaration (configs/numerics/<backend>.json, or a plugin's
  // coverage_backend_numerics()); "" is no declaration. Errors name the
  // source and the member.
  static Result<DeclaredNumerics> FromJson(std::string_view text, std::string_view source);
};

}  // namespace coverage::replay
