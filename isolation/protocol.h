// The worker protocol's messages (isolation.h lists them): parsing one line
// from the other side into what it says. Torch-free and free of processes,
// so the parsers can be tested and fuzzed alone (fuzz/worker_protocol.cc).
//
// Every function takes a line from outside (a worker that may have printed
// anything before it died, a parent of another build) and never throws: a
// line of the wrong shape is an error value naming what was wrong.
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/case_result.h"
#include "core/result.h"
#include "replay/model_check.h"

namespace coverage::isolation {

// ---------------------------------------------------------------- parent side

// The reply to {"setup": ...}: {"ready": true, "numerics": "<the declared
// numerics the worker judges under, as JSON text>", ...} gives what it says
// (a missing or mistyped "numerics" reads as none); otherwise an
// InvalidArgument whose message is the worker's "error" text, or the line
// itself when it has none.
struct SetupReply {
  std::string numerics;
  std::string backend_name, backend_version;  // the worker's backends::IdentityOf
};
Result<SetupReply> ParseSetupReply(std::string_view line);

// The reply to {"unit": ...}: the CaseResult object inside {"result": {...}}.
// Errors: Corruption (a result that does not parse, with the context
// "reading a worker's result"); Internal for any other answer, quoting it.
Result<CaseResult> ParseUnitReply(std::string_view line);

// The reply to {"model": ...}: the items of {"items": [...]}. Errors:
// Corruption (an item that does not parse, with the context "reading a
// worker's model result"); Internal for any other answer, quoting it.
Result<std::vector<ModelItemResult>> ParseModelReply(std::string_view line);

// ---------------------------------------------------------------- worker side

// A request is a JSON object whose first object-valued member names what
// is asked: {"setup": {...WorkerSetup}}, or the request of a test stage
// family (apps/test_stages.h), e.g. {"unit": {...OpCase}, "again": true}
// or {"model": {"stage": ..., "model_id": ..., "profile": ...}}.
struct WorkerRequest {
  std::string kind;      // "setup", a family's request name, or empty when no member is an object
  nlohmann::json body;   // that member's value
  nlohmann::json whole;  // the request object, for flags beside the body ("again")
};

// Errors: InvalidArgument when the line is not a JSON object.
Result<WorkerRequest> ParseWorkerRequest(std::string_view line);

}  // namespace coverage::isolation
