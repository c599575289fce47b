#include "crawler/agent_regions.h"

#include <algorithm>
#include <bit>
#include <cstdio>

namespace coverage::crawler::detail {
namespace {

const char* KindName(int k) {
  static const char* const kNames[] = {"none", "finetune", "adapter", "quantized", "merge"};
  return kNames[k];
}

}  // namespace

RegionOf RegionFor(const HubModel& m) {
  RegionOf r;
  std::string base, quant;
  for (const std::string& tag : m.tags) {
    if (tag.rfind("base_model:", 0) == 0) {
      const std::string rest = tag.substr(11);
      const size_t colon = rest.find(':');
      if (colon == std::string::npos) continue;
      const std::string relation = rest.substr(0, colon);
      const Kind k = relation == "finetune"    ? kFinetune
                     : relation == "adapter"   ? kAdapter
                     : relation == "quantized" ? kQuantized
                     : relation == "merge"     ? kMerge
                                               : kNone;
      if (k != kNone && r.kind == kNone) {
        r.kind = k;
        base = rest.substr(colon + 1);
        r.facet = tag;
      }
    } else if (tag == "gptq" || tag == "awq" || tag == "bitsandbytes" || tag == "gguf" || tag == "exl2" ||
               tag == "fp8" || tag == "compressed-tensors") {
      quant = tag;
    }
  }
  if (r.kind == kNone && m.library_name == "peft") r.kind = kAdapter;
  if (r.facet.empty() && !m.model_type.empty()) r.facet = m.model_type;
  r.group = std::string(KindName(r.kind)) + (quant.empty() ? "" : ":" + quant);
  r.key = (m.model_type.empty() ? "?" : m.model_type) + "|" + (m.architectures.empty() ? "" : m.architectures[0]) +
          "|" + KindName(r.kind) + "|" + base + "|" + quant;
  return r;
}

int DepthBucket(int64_t fetched) {
  return std::min(kDepthBuckets - 1, fetched <= 0 ? 0 : static_cast<int>(std::bit_width(static_cast<uint64_t>(fetched))));
}

int State(const Region& r) { return std::min<int>(kStates - 1, static_cast<int>(r.outcomes.size())); }

double RegionGain(Region& r, std::string* why) {
  // Two estimates of the new fine signatures the next fetch reveals; the
  // larger counts. (1) What fetches at this state and depth revealed in
  // the group: learns fast which groups pay and how soon they stop paying.
  // (2) The chance that a region of the group in this state still holds a
  // new signature, times the chance that the next fetch shows an outcome
  // this region has not shown yet, (outcomes seen once + 1) / (fetches + 1)
  // (Good-Turing with one pseudo-count): it decays as 1 / fetches instead of
  // dropping to zero, so a budget left over goes to regions whose group is
  // known to hide late variants.
  GroupStats& g = *r.stats;
  const int state = State(r), bucket = DepthBucket(r.fetched);
  const double pooled = g.Rate(state, bucket);
  const double unseen = (static_cast<double>(r.singletons) + 1.0) / (static_cast<double>(r.fetched) + 1.0);
  const double tail = g.W(state) * unseen;
  if (why) {
    char buf[300];
    if (pooled >= tail) {
      std::snprintf(buf, sizeof buf,
                    "%s regions with %d outcome(s) at depth bucket %d revealed new signatures in %lld of %lld fetches",
                    r.group.c_str(), state, bucket, static_cast<long long>(g.discoveries[state][bucket]),
                    static_cast<long long>(g.fetches[state][bucket]));
    } else {
      std::snprintf(buf, sizeof buf,
                    "%s regions with %d outcome(s) went on to a new signature in %lld of %lld cases; this one "
                    "showed %zu outcome(s) in %lld fetches, %lld only once",
                    r.group.c_str(), state, static_cast<long long>(g.moved_on[state]),
                    static_cast<long long>(g.reached[state]), r.outcomes.size(), static_cast<long long>(r.fetched),
                    static_cast<long long>(r.singletons));
    }
    *why = buf;
  }
  return std::max(pooled, tail);
}

bool RecordOutcome(Region& r, const std::optional<std::string>& sig, std::unordered_set<std::string>* fine) {
  GroupStats& g = *r.stats;
  const int before = State(r), bucket = DepthBucket(r.fetched);
  if (r.fetched_in_state == 0) ++g.reached[before];  // the first fetch made in this state
  ++r.fetched_in_state;
  const bool discovered = sig && fine->insert(*sig).second;
  g.dirty = true;
  ++g.fetches[before][bucket];
  if (discovered) {
    ++g.discoveries[before][bucket];
    ++r.discoveries;
  }
  const int64_t seen = ++r.outcomes[sig.value_or("")];
  if (seen == 1) ++r.singletons;
  if (seen == 2) --r.singletons;
  ++r.fetched;
  if (seen == 1) {
    // A new outcome for the region: it leaves its state (3+ stays 3+).
    if (discovered) ++g.moved_on[before];
    if (State(r) != before) r.fetched_in_state = 0;
  }
  return discovered;
}

}  // namespace coverage::crawler::detail
