// The crawl agent: spends a request budget where the design space is still
// unexplored, instead of fetching every config.json on the Hub.
//
// Note [Crawl agent]
// The agent keeps a running picture of what it has seen:
//   - REGIONS of listed models that are likely to share configs: the same
//     model_type, architecture, relation to a base model and base model
//     (from the Hub's `base_model:<relation>:<id>` tags) and quantization
//     tag. Each region keeps its unfetched members.
//   - The fine signatures (selection/signature.h) its fetched configs have
//     revealed, and each region's OUTCOMES (the signatures of its fetched
//     configs, or "none" when a config is missing or unreadable). A region's
//     STATE is how many different outcomes it showed (0, 1, 2, 3+).
//   - For each GROUP of regions (the relation: finetune, adapter, quantized,
//     merge or none, with the quantization tag), what fetches revealed:
//     (a) by state and depth (fetches made before: 0, 1, 2-3, 4-7, ...), the
//         share of fetches that revealed a new fine signature, each depth
//         smoothed toward the one above it;
//     (b) by state, the share of regions that went on from that state to a
//         new fine signature: w(state).
// The expected gain of fetching one more config of a region is the larger
// of (a) at its state and depth, and w(state) times the chance that the
// next fetch shows an outcome the region has not shown yet, (outcomes seen
// once + 1) / (fetches + 1) (Good-Turing with one pseudo-count). (a) learns
// quickly which groups pay and when they stop paying (adapters have no
// config; an awq region holds one signature; a bitsandbytes region two);
// (b) keeps a left-over budget going to groups known to hide late, rare
// variants (a fine-tune that added tokens past a power of two), decaying as
// 1 / fetches rather than stopping.
// Each step it takes the action with the highest expected number of new
// fine signatures per request:
//   - fetch the config of a region's next member (its most downloaded first,
//     then seeded random picks; listed-as-gated members last without a
//     token; a gated answer does not count as a sample);
//   - read the next page of a listing stream (the whole listing by
//     downloads, and by creation date, newest first: new families show up
//     there before they are downloaded much), expected to reveal as many new
//     regions as its recent pages did (a moving average) times the chance
//     that a region's first fetch reveals something new;
//   - read the next page of a facet query (`filter=<base_model tag>` or
//     `filter=<model_type>`) that refills a region whose members ran out,
//     valued at half the region's expected gain (two requests per fetch).
// A region is saturated when its expected gain falls below `min_gain`
// (`saturate_region` in the trace): no action below `min_gain` is ever
// taken, so it gets no more fetches unless its group's evidence raises its
// expected gain again (`reopen_region`). The agent stops when no action is
// worth `min_gain`, when the budget is spent (every request counts, retries
// included, checked before it is sent), or when it is told to stop.
//
// Every decision is a line of the JSONL trace: the action, why, the expected
// gain and the observed gain (new fine signatures, or new regions for a
// page), with the requests used so far. ExplainTrace summarises a trace.
//
// Resumable: listing pages go to the sink with their next cursor (one crawl
// per stream and per facet), configs go to the sink as fetched, and the
// trace holds the requests used. With `resume`, the agent rebuilds its
// picture from the sink's stored models and configs and the trace, and
// continues with the rest of the budget; if the trace does not end with a
// stop (the agent was killed mid-action), the most one action can send is
// charged, so the budget holds across kills too.
//
// Thread safety: RunAgent runs on the calling thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "crawler/crawl.h"

namespace coverage::crawler {

// Reads a config.json body into its fine signature; nullopt when the config
// cannot be read. Supplied by the caller (selection::FineSignature).
using Classifier = std::function<std::optional<std::string>(std::string_view config_json)>;

struct AgentOptions {
  // Endpoint, token, rate, retries, page_limit, wait_scale and stop are
  // used; query, max_models, fetch_configs, model_ids and resume are not.
  CrawlOptions transport;
  int64_t budget = 10000;  // requests in all, retries included, across resumed runs
  uint64_t seed = 1;
  double min_gain = 0.0001;  // new fine signatures per request below which nothing is worth doing
  std::string trace_path;   // JSONL trace; required
  bool resume = false;
  std::function<void(int64_t requests, int64_t fine_signatures)> on_progress;
};

struct AgentSummary {
  int64_t requests = 0;  // in all, across resumed runs
  int64_t pages = 0;
  int64_t configs_fetched = 0;  // configs requested (any outcome), this run
  int64_t fine_signatures = 0;
  int64_t regions = 0;
  int64_t saturated_regions = 0;  // regions below min_gain at the end
  std::string stopped_because;
  bool interrupted = false;
  // (requests used, fine signatures known) after every discovery.
  std::vector<std::pair<int64_t, int64_t>> curve;
};

// Storage the agent resumes from: a CrawlSink that can also list what it
// holds. `fn` gets every stored model, its config status (nullopt: none yet)
// and its config body when fetched.
class AgentSink : public CrawlSink {
 public:
  virtual Status ForEachStoredModel(
      const std::function<Status(const HubModel&, std::optional<ConfigStatus>, std::string_view config)>& fn) = 0;
};

// Errors: InvalidArgument for bad options (no trace path, budget < 1,
// resume without a trace); IoError when the endpoint fails for good; the
// sink's errors. Running out of budget or being stopped is not an error.
Result<AgentSummary> RunAgent(const AgentOptions& options, AgentSink& sink, const HttpClientFactory& make_client,
                              const Classifier& classify);

// A readable summary of a trace file: actions, requests, the discovery
// curve, the most explored and the saturated regions, why it stopped.
Result<std::string> ExplainTrace(const std::string& trace_path);

}  // namespace coverage::crawler
