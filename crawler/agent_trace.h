// The crawl agent's JSONL trace (Note [Crawl agent] in agent.h): one JSON
// object a line per decision. Writing it, and reading back what a resumed
// run needs; ExplainTrace (agent.h) summarises one. Internal to the crawler.
//
// Thread safety: a TraceWriter is used by one thread.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace coverage::crawler::detail {

class TraceWriter {
 public:
  // Opens the trace at `path`: truncated, or with `resume` to append to it,
  // after dropping a last line that a kill cut short (so that every line
  // stays one JSON object). Errors: InvalidArgument when resuming without a
  // trace at `path`; IoError when it cannot be repaired or written.
  Status Open(const std::string& path, bool resume);

  // Appends `line` and flushes it at once: a killed agent must not lose the
  // requests it spent. Errors: IoError.
  Status Write(const nlohmann::json& line);

 private:
  std::string path_;
  std::ofstream out_;
};

// What a trace says about the runs that wrote it, for resuming.
struct TraceHistory {
  int64_t requests = 0;  // the most requests any line reports
  int64_t steps = 0;     // the highest step
  // (model, fine signature or nullopt) of every config fetch that was not
  // gated, in order.
  std::vector<std::pair<std::string, std::optional<std::string>>> fetches;
  int64_t lines = 0;   // lines read, empty ones and a last one cut short included
  bool ended = false;  // the last decision is a stop: no action was cut short
};

// Reads the trace at `path`. A last line that is not JSON (cut by a kill)
// is skipped; Corruption for any other line that is not JSON.
Result<TraceHistory> ReadTraceHistory(const std::string& path);

}  // namespace coverage::crawler::detail
