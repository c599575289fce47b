// The crawl agent against synthetic hubs whose full contents are known:
// coverage per request next to exhaustive and random crawls, the budget,
// the trace, determinism, resume, and the registry sink.
#include <atomic>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "crawler/agent.h"
#include "crawler/curl_http_client.h"
#include "registry/registry.h"
#include "crawler/registry_sink.h"
#include "tests/support/agent_support.h"
#include "tests/support/family_defaults.h"
#include "tests/support/temp_dir.h"
#include "tools/hub-replay/hub_server.h"

namespace coverage::crawler {
namespace {

using nlohmann::json;

std::shared_ptr<const selection::FamilyDefaults> Defaults() { return testing::RealFamilyDefaults(); }

crawler::HttpClientFactory Curl() {
  return [] { return std::make_unique<crawler::CurlHttpClient>(); };
}

struct Hub {
  std::unique_ptr<hub_replay::HubServer> server;
  testing::HubTruth truth;
};

// One synthetic hub (and its truth) per size, shared by the tests.
Hub& SyntheticHub(int64_t models) {
  static std::map<int64_t, Hub> hubs;
  static testing::CachedClassifier classify(Defaults());
  auto it = hubs.find(models);
  if (it != hubs.end()) return it->second;
  hub_replay::HubOptions options;
  options.synthetic = models;
  options.seed = 3;
  auto server = hub_replay::HubServer::Start(options);
  EXPECT_TRUE(server.has_value());
  Hub& hub = hubs[models];
  hub.server = std::move(*server);
  hub.truth = testing::ComputeTruth(*hub.server, classify);
  return hub;
}

crawler::AgentOptions Options(const hub_replay::HubServer& server, const std::string& trace, int64_t budget) {
  crawler::AgentOptions o;
  o.transport.endpoint = server.endpoint();
  o.transport.rate_per_s = 0;
  o.transport.wait_scale = 0.001;
  o.budget = budget;
  o.trace_path = trace;
  return o;
}

std::vector<json> ReadTrace(const std::string& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  std::string text;
  while (std::getline(in, text)) lines.push_back(json::parse(text));
  return lines;
}

TEST(CrawlAgent, FindsNearlyEveryFineSignatureWithAFractionOfTheFetches) {
  Hub& hub = SyntheticHub(50000);
  testing::TempDir dir;
  testing::MemoryAgentSink sink(/*keep_bodies=*/false);
  testing::CachedClassifier classify(Defaults());
  const int64_t budget = hub.truth.configs / 5;  // 20% of an exhaustive crawl's config fetches
  auto s = crawler::RunAgent(Options(*hub.server, dir.File("trace.jsonl"), budget), sink, Curl(),
                             classify.AsClassifier());
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  const double coverage = static_cast<double>(s->fine_signatures) / static_cast<double>(hub.truth.fine.size());
  // Measured: 948 of 969 (97.8%) with 5,769 requests, random sampling 734;
  // bench/README.md has the 1M-model figures.
  EXPECT_GE(coverage, 0.96) << s->fine_signatures << " of " << hub.truth.fine.size() << "; stopped: " << s->stopped_because;
  EXPECT_LE(s->requests, budget);
  // Random sampling with the agent's whole request count as config fetches.
  const auto random = testing::RandomBaseline(hub.truth, {s->requests}, 1);
  EXPECT_GT(s->fine_signatures, random[0] + static_cast<int64_t>(hub.truth.fine.size()) / 10)
      << "random found " << random[0];
  RecordProperty("agent_fine", static_cast<int>(s->fine_signatures));
  RecordProperty("random_fine", static_cast<int>(random[0]));
  RecordProperty("truth_fine", static_cast<int>(hub.truth.fine.size()));
  RecordProperty("requests", static_cast<int>(s->requests));
}

TEST(CrawlAgent, NeverExceedsItsBudgetRetriesIncluded) {
  hub_replay::HubOptions options;
  options.synthetic = 5000;
  options.seed = 3;
  options.faults.rate = 0.1;
  options.faults.max_in_a_row = 2;
  auto hub = hub_replay::HubServer::Start(options);
  ASSERT_TRUE(hub.has_value());
  testing::TempDir dir;
  testing::CachedClassifier classify(Defaults());
  for (int64_t budget : {1, 7, 60, 400}) {
    testing::MemoryAgentSink sink;
    const int64_t before = (*hub)->stats().requests;
    auto s = crawler::RunAgent(Options(**hub, dir.File("t.jsonl"), budget), sink, Curl(), classify.AsClassifier());
    ASSERT_TRUE(s.has_value()) << s.error().ToString();
    EXPECT_LE(s->requests, budget);
    EXPECT_LE((*hub)->stats().requests - before, budget) << "the server saw more requests than the budget";
    EXPECT_EQ(s->stopped_because, "budget spent") << budget;
  }
}

TEST(CrawlAgent, EveryDecisionIsTracedAndTheSameSeedDecidesTheSame) {
  Hub& hub = SyntheticHub(20000);
  testing::TempDir dir;
  testing::CachedClassifier classify(Defaults());
  auto run = [&](const std::string& name, uint64_t seed) {
    testing::MemoryAgentSink sink(false);
    auto o = Options(*hub.server, dir.File(name), 1500);
    o.seed = seed;
    auto s = crawler::RunAgent(o, sink, Curl(), classify.AsClassifier());
    EXPECT_TRUE(s.has_value());
    std::vector<std::string> decisions;
    for (const json& line : ReadTrace(dir.File(name))) {
      decisions.push_back(line.value("action", "") + " " + line.value("model", "") + line.value("url", ""));
    }
    return decisions;
  };
  const auto a = run("a.jsonl", 5);
  EXPECT_EQ(a, run("b.jsonl", 5));
  EXPECT_NE(a, run("c.jsonl", 6));

  std::set<std::string> actions;
  int64_t last_requests = 0;
  for (const json& line : ReadTrace(dir.File("a.jsonl"))) {
    const std::string action = line.at("action");
    actions.insert(action);
    EXPECT_FALSE(line.value("why", "").empty()) << line.dump();
    EXPECT_GE(line.at("requests").get<int64_t>(), last_requests);
    last_requests = line.at("requests");
    if (action == "fetch_config" || action == "list_page" || action == "facet_page") {
      EXPECT_TRUE(line.contains("expected_gain")) << line.dump();
      EXPECT_TRUE(line.contains("observed_gain")) << line.dump();
    }
  }
  EXPECT_TRUE(actions.count("start"));
  EXPECT_TRUE(actions.count("list_page"));
  EXPECT_TRUE(actions.count("fetch_config"));
  EXPECT_TRUE(actions.count("stop"));
  auto explained = crawler::ExplainTrace(dir.File("a.jsonl"));
  ASSERT_TRUE(explained.has_value());
  EXPECT_NE(explained->find("fine signatures found"), std::string::npos) << *explained;
  EXPECT_NE(explained->find("stopped: "), std::string::npos);
  EXPECT_FALSE(crawler::ExplainTrace(dir.File("missing.jsonl")).has_value());
}

TEST(CrawlAgent, StopsWhenNothingIsWorthARequest) {
  Hub& hub = SyntheticHub(20000);
  testing::TempDir dir;
  testing::MemoryAgentSink sink(false);
  testing::CachedClassifier classify(Defaults());
  auto o = Options(*hub.server, dir.File("t.jsonl"), 1000000);
  o.min_gain = 0.05;  // a high bar: regions saturate early
  auto s = crawler::RunAgent(o, sink, Curl(), classify.AsClassifier());
  ASSERT_TRUE(s.has_value());
  EXPECT_LT(s->requests, hub.truth.configs / 4);
  EXPECT_NE(s->stopped_because.find("no action is expected"), std::string::npos) << s->stopped_because;
  EXPECT_GT(s->saturated_regions, 0);
}

TEST(CrawlAgent, ResumesFromTheRegistryAndTheTraceWithinTheSameBudget) {
  Hub& hub = SyntheticHub(20000);
  testing::TempDir dir;
  testing::CachedClassifier classify(Defaults());
  auto reg = registry::Registry::Open(dir.File("agent.db"));
  ASSERT_TRUE(reg.has_value());
  RegistryCrawlSink sink(reg->get());
  const int64_t budget = 2500;
  std::atomic<bool> stop{false};
  auto o = Options(*hub.server, dir.File("agent.jsonl"), budget);
  o.transport.page_limit = 50;  // small pages: regions run out and are refilled through facet pages
  o.transport.stop = &stop;
  const int64_t server_before = hub.server->stats().requests;
  o.on_progress = [&](int64_t requests, int64_t) {
    if (requests > 600) stop = true;
  };
  auto first = crawler::RunAgent(o, sink, Curl(), classify.AsClassifier());
  ASSERT_TRUE(first.has_value()) << first.error().ToString();
  EXPECT_TRUE(first->interrupted);
  EXPECT_LT(first->requests, budget);

  stop = false;
  o.on_progress = nullptr;
  o.resume = true;
  auto second = crawler::RunAgent(o, sink, Curl(), classify.AsClassifier());
  ASSERT_TRUE(second.has_value()) << second.error().ToString();
  EXPECT_FALSE(second->interrupted);
  EXPECT_LE(second->requests, budget);
  EXPECT_GT(second->requests, first->requests);
  EXPECT_GT(second->fine_signatures, first->fine_signatures);
  // Nothing fetched twice: every stored config status came from one fetch.
  auto fetched = (*reg)->Query("SELECT COUNT(*) FROM models WHERE config_status IS NOT NULL");
  int64_t fetch_lines = 0;
  bool resumed = false;
  for (const json& line : ReadTrace(dir.File("agent.jsonl"))) {
    fetch_lines += line.value("action", "") == "fetch_config";
    resumed |= line.value("action", "") == "resume";
  }
  EXPECT_TRUE(resumed);
  EXPECT_EQ(std::stoll(fetched->rows[0][0]), fetch_lines);
  EXPECT_LE(hub.server->stats().requests - server_before, budget) << "both runs together";
  // Facet pages were read through the registry sink, each facet a crawl of its own.
  EXPECT_GT(std::stoll((*reg)->Query("SELECT COUNT(*) FROM crawls WHERE crawl_id LIKE '%filter=%'")->rows[0][0]), 0);
  int64_t facet_pages = 0;
  for (const json& line : ReadTrace(dir.File("agent.jsonl"))) facet_pages += line.value("action", "") == "facet_page";
  EXPECT_GT(facet_pages, 0);

  // Resume without a trace is refused, naming the file.
  auto o2 = o;
  o2.trace_path = dir.File("none.jsonl");
  auto refused = crawler::RunAgent(o2, sink, Curl(), classify.AsClassifier());
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message().find("none.jsonl"), std::string::npos);
}

TEST(CrawlAgent, AKilledRunIsChargedTheMostItsLastActionCouldHaveSent) {
  Hub& hub = SyntheticHub(20000);
  testing::TempDir dir;
  testing::CachedClassifier classify(Defaults());
  testing::MemoryAgentSink sink;
  const std::string trace = dir.File("killed.jsonl");
  auto o = Options(*hub.server, trace, 300);
  auto first = crawler::RunAgent(o, sink, Curl(), classify.AsClassifier());
  ASSERT_TRUE(first.has_value());
  // As if killed in the middle of an action: no stop line, the last line cut.
  std::vector<std::string> lines;
  {
    std::ifstream in(trace);
    std::string text;
    while (std::getline(in, text)) lines.push_back(text);
  }
  ASSERT_EQ(json::parse(lines.back()).at("action"), "stop");
  const int64_t used = json::parse(lines[lines.size() - 2]).at("requests");
  {
    std::ofstream out(trace, std::ios::trunc);
    for (size_t i = 0; i + 1 < lines.size(); ++i) out << lines[i] << '\n';
    out << "{\"action\": \"fetch_con";  // cut mid-write, no newline
  }
  o.budget = 400;
  o.resume = true;
  auto second = crawler::RunAgent(o, sink, Curl(), classify.AsClassifier());
  ASSERT_TRUE(second.has_value()) << second.error().ToString();
  EXPECT_LE(second->requests, 400);
  bool charged = false;
  for (const json& line : ReadTrace(trace)) {  // every line parses: the cut line was ended
    if (line.value("action", "") == "resume") {
      charged = line.value("why", "").find("charged") != std::string::npos;
      EXPECT_GE(line.at("requests").get<int64_t>(), used + 25);  // 5 tries x 5 tries
    }
  }
  EXPECT_TRUE(charged);
}

TEST(CrawlAgent, ATraceWithWrongTypesIsExplainedNotThrown) {
  testing::TempDir dir;
  {
    std::ofstream out(dir.File("odd.jsonl"));
    out << R"({"action": 5, "requests": "many", "why": ["x"]})" << '\n'
        << R"({"action": "fetch_config", "observed_gain": "one", "region": 3, "requests": 7})" << '\n'
        << "not json\n";
  }
  auto text = crawler::ExplainTrace(dir.File("odd.jsonl"));
  ASSERT_TRUE(text.has_value()) << text.error().ToString();
  EXPECT_NE(text->find("2 decisions, 7 requests"), std::string::npos) << *text;
  EXPECT_NE(text->find("1 unreadable lines"), std::string::npos) << *text;
}

}  // namespace
}  // namespace coverage::crawler
