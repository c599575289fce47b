// The crawl agent's coverage per request on a synthetic hub whose full
// contents are known, next to an exhaustive crawl and random sampling with
// the same budget, in one run.
//
//   truth       every model's config classified in process (what an
//               exhaustive crawl, fetching every config, would find)
//   agent       RunAgent over HTTP against hub-replay (loopback, no rate
//               limit), budget = --budget-share of the exhaustive crawl's
//               config fetches; list pages and retries count as requests
//   random      fine signatures found by fetching as many configs as the
//               agent sent requests, picked uniformly at random from all
//               models (listing for free)
// Prints the discovery curve of both at fixed request counts.
//
//   build/bin/bench_crawl_agent [--models 1000000] [--budget-share 0.1] [--min-gain 0.0001] [--seed 1] [--show-missed] [--trace FILE]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "crawler/agent.h"
#include "crawler/curl_http_client.h"
#include "tests/support/agent_support.h"
#include "tests/support/temp_dir.h"

int main(int argc, char** argv) {
  using namespace coverage;
  int64_t models = 1000000;
  double share = 0.1, min_gain = 0.0001;
  uint64_t seed = 1;
  bool show_missed = false;
  std::string trace;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--show-missed")) {
      show_missed = true;
    } else if (!std::strcmp(argv[i], "--models") && has_value) {
      models = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--budget-share") && has_value) {
      share = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--min-gain") && has_value) {
      min_gain = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--seed") && has_value) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--trace") && has_value) {
      trace = argv[++i];
    } else {
      std::fprintf(stderr, "unknown or incomplete argument '%s'\n", argv[i]);
      return 2;
    }
  }
  auto defaults = selection::FamilyDefaults::Load(std::string(COVERAGE_SOURCE_DIR) + "/data/transformers_defaults.jsonl");
  if (!defaults) return 2;
  hub_replay::HubOptions options;
  options.synthetic = models;
  options.seed = 3;
  auto hub = hub_replay::HubServer::Start(options);
  if (!hub) {
    std::fprintf(stderr, "%s\n", hub.error().ToString().c_str());
    return 2;
  }
  testing::CachedClassifier classify(*defaults);
  auto t0 = std::chrono::steady_clock::now();
  const testing::HubTruth truth = testing::ComputeTruth(**hub, classify);
  std::printf("hub: %lld models, %lld with a config.json (the exhaustive crawl's fetches), %zu fine signatures "
              "(truth in %.1fs)\n",
              static_cast<long long>(truth.models), static_cast<long long>(truth.configs), truth.fine.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  testing::TempDir dir;
  testing::MemoryAgentSink sink(/*keep_bodies=*/false);
  crawler::AgentOptions agent;
  agent.transport.endpoint = (*hub)->endpoint();
  agent.transport.rate_per_s = 0;
  agent.budget = static_cast<int64_t>(share * static_cast<double>(truth.configs));
  agent.min_gain = min_gain;
  agent.seed = seed;
  agent.trace_path = trace.empty() ? dir.File("agent.jsonl") : trace;
  t0 = std::chrono::steady_clock::now();
  auto s = crawler::RunAgent(agent, sink, [] { return std::make_unique<crawler::CurlHttpClient>(); },
                             classify.AsClassifier());
  if (!s) {
    std::fprintf(stderr, "%s\n", s.error().ToString().c_str());
    return 2;
  }
  const double agent_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& sum = *s;
  const double n = static_cast<double>(truth.fine.size());
  std::printf("agent: budget %lld; used %lld requests (%lld list/facet pages, %lld config fetches = %.2f%% of "
              "exhaustive) in %.1fs; stopped: %s\n",
              static_cast<long long>(agent.budget), static_cast<long long>(sum.requests),
              static_cast<long long>(sum.pages), static_cast<long long>(sum.configs_fetched),
              100.0 * static_cast<double>(sum.configs_fetched) / static_cast<double>(truth.configs), agent_s,
              sum.stopped_because.c_str());
  std::printf("  fine signatures: agent %lld (%.2f%%), exhaustive %zu (100%% with %lld fetches)\n",
              static_cast<long long>(sum.fine_signatures), 100.0 * static_cast<double>(sum.fine_signatures) / n,
              truth.fine.size(), static_cast<long long>(truth.configs));

  std::vector<int64_t> checkpoints;
  for (int64_t at : {100, 300, 1000, 3000, 10000, 20000, 30000, 100000}) {
    if (at < sum.requests) checkpoints.push_back(at);
  }
  checkpoints.push_back(sum.requests);
  const auto random = testing::RandomBaseline(truth, checkpoints, seed);
  std::printf("  %10s %14s %14s\n", "requests", "agent", "random");
  for (size_t i = 0; i < checkpoints.size(); ++i) {
    int64_t found = 0;
    for (const auto& [r, f] : sum.curve) {
      if (r <= checkpoints[i]) found = f;
    }
    std::printf("  %10lld %7lld %5.1f%% %7lld %5.1f%%\n", static_cast<long long>(checkpoints[i]),
                static_cast<long long>(found), 100.0 * static_cast<double>(found) / n,
                static_cast<long long>(random[i]), 100.0 * static_cast<double>(random[i]) / n);
  }
  // Requests needed to reach 99% of the fine signatures.
  const int64_t target = static_cast<int64_t>(std::ceil(0.99 * n));
  int64_t agent_at = -1;
  for (const auto& [r, f] : sum.curve) {
    if (f >= target) {
      agent_at = r;
      break;
    }
  }
  std::vector<int64_t> fine_steps;
  for (int64_t at = 250; at <= truth.models; at += 250) fine_steps.push_back(at);
  const auto random_steps = testing::RandomBaseline(truth, fine_steps, seed);
  int64_t random_at = -1;
  for (size_t i = 0; i < fine_steps.size(); ++i) {
    if (random_steps[i] >= target) {
      random_at = fine_steps[i];
      break;
    }
  }
  std::printf("  requests to reach 99%% (%lld signatures): agent %lld, random %lld (to the nearest 250), exhaustive "
              "%lld\n",
              static_cast<long long>(target), static_cast<long long>(agent_at), static_cast<long long>(random_at),
              static_cast<long long>(truth.configs));

  if (show_missed) {
    // Which signatures the agent missed, how common they are, and one model
    // that has each.
    std::unordered_set<std::string> found;
    std::ifstream in(agent.trace_path);
    std::string text;
    while (std::getline(in, text)) {
      auto j = nlohmann::json::parse(text, nullptr, false);
      if (j.is_object() && j.contains("fine") && j["fine"].is_string()) found.insert(j["fine"].get<std::string>());
    }
    std::map<std::string, std::pair<int64_t, std::string>> missed;
    for (int64_t i = 0; i < truth.models; ++i) {
      const auto& sig = truth.signature_of[static_cast<size_t>(i)];
      if (!sig || found.count(*sig)) continue;
      auto& m = missed[*sig];
      if (m.first++ == 0) m.second = (*hub)->ModelIdAt(i);
    }
    for (const auto& [sig, m] : missed) {
      std::printf("  missed (%lld models, e.g. %s): %s\n", static_cast<long long>(m.first), m.second.c_str(), sig.c_str());
    }
  }
  return 0;
}
