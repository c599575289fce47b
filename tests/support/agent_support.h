// Support for crawl agent tests and benchmarks: an in-memory AgentSink, the
// ground truth of a hub-replay hub (every fine signature it holds), and the
// random-sampling baseline.
#pragma once

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "crawler/agent.h"
#include "selection/features.h"
#include "selection/signature.h"
#include "tools/hub-replay/hub_server.h"

namespace coverage::testing {

// Keeps listed models, cursors and config outcomes in memory.
class MemoryAgentSink final : public crawler::AgentSink {
 public:
  explicit MemoryAgentSink(bool keep_bodies = true) : keep_bodies_(keep_bodies) {}

  Result<std::optional<std::string>> NextPage(const std::string& crawl_id, bool resume) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (resume) {
      auto it = cursors_.find(crawl_id);
      if (it != cursors_.end()) return it->second;
    }
    cursors_[crawl_id] = crawl_id;
    return std::optional<std::string>(crawl_id);
  }
  Status StorePage(const std::string& crawl_id, const std::vector<crawler::HubModel>& models,
                   const std::vector<crawler::Reject>&, const std::optional<std::string>& next_url) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& m : models) {
      if (models_.emplace(m.id, m).second) order_.push_back(m.id);
    }
    cursors_[crawl_id] = next_url;
    return Status::Ok();
  }
  Result<std::vector<std::string>> ModelsWithoutConfig(int64_t) override { return std::vector<std::string>{}; }
  Status StoreConfig(const std::string& id, crawler::ConfigStatus status, const std::string&,
                     const std::string& body) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (configs_.count(id)) return Status::Internal("config of '" + id + "' stored twice");
    configs_[id] = {status, keep_bodies_ ? body : std::string()};
    return Status::Ok();
  }
  Status ForEachStoredModel(const std::function<Status(const crawler::HubModel&, std::optional<crawler::ConfigStatus>,
                                                       std::string_view)>& fn) override {
    for (const std::string& id : order_) {
      auto c = configs_.find(id);
      if (c == configs_.end()) {
        COV_RETURN_IF_ERROR(fn(models_.at(id), std::nullopt, ""));
      } else {
        COV_RETURN_IF_ERROR(fn(models_.at(id), c->second.first, c->second.second));
      }
    }
    return Status::Ok();
  }

  size_t models() const { return models_.size(); }
  size_t configs() const { return configs_.size(); }

 private:
  bool keep_bodies_;
  std::mutex mu_;
  std::unordered_map<std::string, std::optional<std::string>> cursors_;
  std::unordered_map<std::string, crawler::HubModel> models_;
  std::vector<std::string> order_;
  std::unordered_map<std::string, std::pair<crawler::ConfigStatus, std::string>> configs_;
};

// selection::FineSignature of a config body, with results cached by body
// (a hub repeats the same bytes many times). Thread-safe.
class CachedClassifier {
 public:
  explicit CachedClassifier(std::shared_ptr<const selection::FamilyDefaults> defaults)
      : defaults_(std::move(defaults)) {}
  std::optional<std::string> operator()(std::string_view config) {
    const size_t key = std::hash<std::string_view>()(config);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) return it->second;
    }
    auto f = selection::ExtractFeatures(config, *defaults_);
    std::optional<std::string> sig = f ? std::optional<std::string>(selection::FineSignature(*f)) : std::nullopt;
    std::lock_guard<std::mutex> lock(mu_);
    cache_.emplace(key, sig);
    return sig;
  }
  crawler::Classifier AsClassifier() {
    return [this](std::string_view config) { return (*this)(config); };
  }

 private:
  std::shared_ptr<const selection::FamilyDefaults> defaults_;
  std::mutex mu_;
  std::unordered_map<size_t, std::optional<std::string>> cache_;
};

// What an exhaustive crawl of the hub would find.
struct HubTruth {
  std::unordered_set<std::string> fine;  // every fine signature of a readable config
  int64_t models = 0;
  int64_t configs = 0;  // models with a config.json: the config fetches of an exhaustive crawl
  std::vector<std::optional<std::string>> signature_of;  // per model index
};

inline HubTruth ComputeTruth(const hub_replay::HubServer& hub, CachedClassifier& classify) {
  HubTruth t;
  t.models = hub.model_count();
  t.signature_of.resize(static_cast<size_t>(t.models));
  for (int64_t i = 0; i < t.models; ++i) {
    auto bytes = hub.ConfigBytes(hub.ModelIdAt(i));
    if (!bytes) continue;
    ++t.configs;
    auto sig = classify(*bytes);
    t.signature_of[static_cast<size_t>(i)] = sig;
    if (sig) t.fine.insert(*sig);
  }
  return t;
}

// Fine signatures found by fetching `fetches` models picked uniformly at
// random (without replacement) from the whole hub; the curve has the count
// after each of `checkpoints` fetches.
inline std::vector<int64_t> RandomBaseline(const HubTruth& truth, const std::vector<int64_t>& checkpoints,
                                           uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(truth.models));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::mt19937_64 rng(seed);
  std::unordered_set<std::string> found;
  std::vector<int64_t> out;
  int64_t done = 0;
  for (int64_t at : checkpoints) {
    while (done < at && done < truth.models) {
      // Partial Fisher-Yates: only as far as needed.
      std::uniform_int_distribution<size_t> pick(static_cast<size_t>(done), order.size() - 1);
      std::swap(order[static_cast<size_t>(done)], order[pick(rng)]);
      const auto& sig = truth.signature_of[static_cast<size_t>(order[static_cast<size_t>(done)])];
      if (sig) found.insert(*sig);
      ++done;
    }
    out.push_back(static_cast<int64_t>(found.size()));
  }
  return out;
}

}  // namespace coverage::testing
