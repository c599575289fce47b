// Expectations: known failures of a backend, with the reason for each
// (configs/expectations/<backend>.json). A failing result that matches one is
// reported as expected_failure; a passing result that matches one is an
// unexpected_pass (the expectation can go). Data, not code (Habit 8).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/outcome.h"
#include "core/result.h"

namespace coverage::reports {

struct Expectation {
  // Which results it covers; an empty field matches anything.
  std::string stage;                  // "unit", "module", "model", "train"
  std::string op;                     // unit: "aten::mm" (any overload) or "aten::mm.out"
  std::string key;                    // unit: one case key
  std::string dtype;                  // unit: a dtype the case uses ("bf16")
  std::string model;                  // model stages: a glob over model ids
  std::string item;                   // model stages: module kind, "forward", "train"
  std::vector<Outcome> outcomes;      // which failing outcomes are expected; empty: any failure
  std::string reason;                 // required: why it fails

  // True when `outcomes` is empty or holds `outcome`.
  bool Lists(Outcome outcome) const;
};

struct Expectations {
  std::string backend;
  std::string source;  // the file it came from
  std::vector<Expectation> entries;

  // Parses {"backend": "sim", "expected_failures": [{..., "reason": "..."}]}.
  // Errors name `source`, the entry's index and the key.
  static Result<Expectations> FromJson(std::string_view json, std::string_view source);
  // The entry covering a unit case / a model item, or nullptr: the first
  // whose `outcomes` list `outcome` (or is empty), else the first covering
  // it at all (no `outcome`: the first covering it).
  const Expectation* MatchCase(std::string_view op_qualified, std::string_view key,
                               const std::vector<std::string>& dtypes,
                               std::optional<Outcome> outcome = std::nullopt) const;
  const Expectation* MatchModelItem(std::string_view stage, std::string_view model_id, std::string_view item,
                                    std::optional<Outcome> outcome = std::nullopt) const;
};

}  // namespace coverage::reports
