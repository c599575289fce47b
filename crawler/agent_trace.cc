#include "crawler/agent_trace.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <map>
#include <system_error>

#include "crawler/agent.h"

namespace coverage::crawler {
namespace {

using nlohmann::json;

// Trace fields, read defensively: a trace is a file a person may edit.
std::string StringField(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
std::optional<int64_t> IntField(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}
double NumberField(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

namespace detail {

Status TraceWriter::Open(const std::string& path, bool resume) {
  path_ = path;
  if (resume) {
    std::ifstream in(path_);
    if (!in) {
      return Status::InvalidArgument("--resume: no trace at '" + path_ + "' to resume from; start without --resume");
    }
  }
  if (resume) {
    // A kill may leave the last line cut short: drop it (it is ignored on
    // reading), so every line of the trace stays one JSON object.
    std::string text;
    {
      std::ifstream in(path_, std::ios::binary);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (!text.empty() && text.back() != '\n') {
      const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      std::error_code ec;
      std::filesystem::resize_file(path_, keep, ec);
      if (ec) return Status::IoError("cannot repair the cut agent trace '" + path_ + "': " + ec.message());
    }
  }
  out_.open(path_, resume ? std::ios::app : std::ios::trunc);
  if (!out_) return Status::IoError("cannot write the agent trace '" + path_ + "'");
  return Status::Ok();
}

Status TraceWriter::Write(const nlohmann::json& line) {
  out_ << line.dump() << '\n';
  out_.flush();
  if (!out_) return Status::IoError("writing the agent trace '" + path_ + "' failed");
  return Status::Ok();
}

Result<TraceHistory> ReadTraceHistory(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  TraceHistory history;
  while (std::getline(in, text)) {
    ++history.lines;
    if (text.empty()) continue;
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      // A line cut by a kill is the last one; anything else is damage.
      if (in.peek() == EOF) break;
      return Status::Corruption("agent trace '" + path + "' line " + std::to_string(history.lines) +
                                " is not JSON; start again without --resume");
    }
    if (auto r = IntField(j, "requests")) history.requests = std::max(history.requests, *r);
    if (auto st = IntField(j, "step")) history.steps = std::max(history.steps, *st);
    const std::string action = StringField(j, "action");
    history.ended = action == "stop";
    const std::string model = StringField(j, "model");
    if (action == "fetch_config" && !model.empty() && StringField(j, "outcome") != "gated") {
      const std::string fine = StringField(j, "fine");
      history.fetches.emplace_back(model, fine.empty() ? std::nullopt : std::optional<std::string>(fine));
    }
  }
  return history;
}

}  // namespace detail

Result<std::string> ExplainTrace(const std::string& trace_path) {
  std::ifstream in(trace_path);
  if (!in) return Status::NotFound("no agent trace at '" + trace_path + "' (run coverage crawl --agent first)");
  std::map<std::string, int64_t> actions;
  std::map<std::string, std::pair<int64_t, int64_t>> regions;  // key -> (fetches, discoveries)
  std::vector<std::string> saturated;
  std::vector<std::pair<int64_t, int64_t>> curve;
  int64_t requests = 0, fine = 0, lines = 0, bad = 0;
  std::string stopped, started;
  double expected_sum = 0, observed_sum = 0;
  std::string text;
  while (std::getline(in, text)) {
    if (text.empty()) continue;
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ++bad;
      continue;
    }
    ++lines;
    std::string action = StringField(j, "action");
    if (action.empty()) action = "?";
    ++actions[action];
    if (auto r = IntField(j, "requests")) requests = *r;
    if (auto f = IntField(j, "fine_signatures")) {
      if (*f > fine) curve.emplace_back(requests, *f);
      fine = std::max(fine, *f);
    }
    if (action == "fetch_config") {
      auto& r = regions[StringField(j, "region")];
      ++r.first;
      const int64_t observed = IntField(j, "observed_gain").value_or(0);
      r.second += observed;
      expected_sum += NumberField(j, "expected_gain");
      observed_sum += static_cast<double>(observed);
    } else if (action == "saturate_region") {
      saturated.push_back(StringField(j, "region"));
    } else if (action == "stop") {
      stopped = StringField(j, "why");
    } else if (action == "start" || action == "resume") {
      started = StringField(j, "why");
    }
  }
  if (lines == 0) return Status::InvalidArgument("agent trace '" + trace_path + "' holds no decisions");
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "agent trace %s: %lld decisions, %lld requests, %lld fine signatures found\n",
                trace_path.c_str(), static_cast<long long>(lines), static_cast<long long>(requests),
                static_cast<long long>(fine));
  out += buf;
  if (!started.empty()) out += "  settings: " + started + "\n";
  out += "  actions:";
  for (const auto& [a, n] : actions) out += " " + a + " " + std::to_string(n) + ";";
  out += "\n";
  const int64_t fetches = actions.count("fetch_config") ? actions["fetch_config"] : 0;
  if (fetches > 0) {
    std::snprintf(buf, sizeof buf,
                  "  config fetches: expected %.1f new signatures in all, observed %.0f (%.1f%% of fetches revealed one)\n",
                  expected_sum, observed_sum, 100.0 * observed_sum / static_cast<double>(fetches));
    out += buf;
  }
  if (!curve.empty()) {
    out += "  discovery curve (requests -> fine signatures):";
    for (double share : {0.1, 0.25, 0.5, 0.75, 1.0}) {
      const int64_t at = static_cast<int64_t>(share * static_cast<double>(requests));
      int64_t f = 0;
      for (const auto& [r, n] : curve) {
        if (r <= at) f = n;
      }
      out += " " + std::to_string(at) + "->" + std::to_string(f);
    }
    out += "\n";
  }
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> top(regions.begin(), regions.end());
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) {
    return a.second.first != b.second.first ? a.second.first > b.second.first : a.first < b.first;
  });
  std::snprintf(buf, sizeof buf, "  regions explored: %zu; saturated: %zu. Most explored:\n", regions.size(),
                saturated.size());
  out += buf;
  for (size_t i = 0; i < top.size() && i < 10; ++i) {
    std::snprintf(buf, sizeof buf, "    %6lld fetches, %4lld new signatures  %s\n",
                  static_cast<long long>(top[i].second.first), static_cast<long long>(top[i].second.second),
                  top[i].first.c_str());
    out += buf;
  }
  out += "  stopped: " + (stopped.empty() ? std::string("(no stop line: the agent was killed; --resume goes on)") : stopped) +
         "\n";
  if (bad > 0) out += "  " + std::to_string(bad) + " unreadable lines skipped\n";
  return out;
}

}  // namespace coverage::crawler
