// The crawl agent's picture of the design space (Note [Crawl agent] in
// agent.h): which region a listed model falls into, what the regions of a
// group revealed, and the expected gain of fetching one more config of a
// region. Internal to the crawler (agent.cc); no I/O.
//
// Thread safety: none; the agent runs on one thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "crawler/hub_model.h"

namespace coverage::crawler::detail {

// Region kinds: the relation to a base model, from the Hub's tags.
enum Kind { kNone, kFinetune, kAdapter, kQuantized, kMerge };

struct RegionOf {
  std::string key;
  std::string group;  // relation and quantization tag: regions that behave alike
  Kind kind = kNone;
  std::string facet;  // the filter= value that lists this region's models ("" = none)
};

// The region of a listed model: model_type, architecture, relation to a
// base model, base model and quantization tag.
RegionOf RegionFor(const HubModel& m);

struct Member {
  int64_t downloads;
  std::string id;
  bool gated = false;  // listed as gated: its config needs a token
};

constexpr int kDepthBuckets = 24;
// 0 for the first fetch, then 1, 2-3, 4-7, ...
int DepthBucket(int64_t fetched);

// A region's state: how many different outcomes its fetches showed (0, 1,
// 2, 3+). An outcome is a fine signature, or "none" (no readable config).
constexpr int kStates = 4;

// What the regions of one group did after reaching each state: how many
// reached it (with at least one fetch made in it) and how many of those
// then showed another outcome that was a fine signature new to the agent.
// w(s) = (moved_on + 1/2) / (reached + 1) estimates the chance that a region
// of the group in state s still holds something new (Note [Crawl agent]).
//
// It also keeps, by state and depth bucket (fetches made before: 0, 1, 2-3,
// 4-7, ...), how many fetches were made and how many revealed a new fine
// signature. The rate of a cell is smoothed toward the cell one depth
// shallower, (D + 2 prior) / (F + 2), so a depth no region has reached yet
// inherits the rate above it; the first fetch's prior is 1/2.
struct GroupStats {
  int64_t reached[kStates] = {};
  int64_t moved_on[kStates] = {};
  int64_t fetches[kStates][kDepthBuckets] = {};
  int64_t discoveries[kStates][kDepthBuckets] = {};
  double rates[kStates][kDepthBuckets] = {};
  bool dirty = true;

  double W(int state) const {
    return (static_cast<double>(moved_on[state]) + 0.5) / (static_cast<double>(reached[state]) + 1.0);
  }
  double Rate(int state, int bucket) {
    if (dirty) {
      for (int s = 0; s < kStates; ++s) {
        double prior = 0.5;
        for (int b = 0; b < kDepthBuckets; ++b) {
          prior = (static_cast<double>(discoveries[s][b]) + 2 * prior) / (static_cast<double>(fetches[s][b]) + 2);
          rates[s][b] = prior;
        }
      }
      dirty = false;
    }
    return rates[state][bucket];
  }
};

struct Region {
  std::string key;
  std::string group;
  GroupStats* stats = nullptr;  // the group's, owned by the agent
  std::string facet;
  std::vector<Member> pool;  // not yet fetched
  int64_t fetched = 0;
  int64_t discoveries = 0;  // fetches that revealed a new fine signature
  // Outcomes of the region's fetches: fine signature (or "" for none) -> count.
  std::map<std::string, int64_t> outcomes;
  int64_t singletons = 0;  // outcomes seen exactly once
  int64_t fetched_in_state = 0;  // fetches since the region reached its state
  bool saturated = false;        // traced once
};

// The region's state (0, 1, 2, 3+ outcomes).
int State(const Region& r);

// The expected number of new fine signatures the next fetch of `r`
// reveals; with `why`, also the reason in words, for the trace.
double RegionGain(Region& r, std::string* why);

// Counts one fetch of `r` whose outcome is `sig` (nullopt: no readable
// config) in the region and its group, adding `sig` to `fine`, the fine
// signatures known. Returns whether `sig` was new to `fine`.
bool RecordOutcome(Region& r, const std::optional<std::string>& sig, std::unordered_set<std::string>* fine);

}  // namespace coverage::crawler::detail
