// The crawl step: a crawler::CrawlSink that stores into the registry. Each
// page goes in with its next URL in one transaction (Registry::StoreCrawlPage),
// so a crawl killed at any moment resumes at the page after the last one
// stored, with no model stored twice.
//
// Thread safety: all calls are serialised on one mutex (config fetches call
// in from several threads).
#pragma once

#include <mutex>

#include "crawler/agent.h"

namespace coverage::registry {
class Registry;
}

namespace coverage::crawler {

class RegistryCrawlSink final : public crawler::AgentSink {
 public:
  explicit RegistryCrawlSink(registry::Registry* registry) : registry_(registry) {}

  Result<std::optional<std::string>> NextPage(const std::string& crawl_id, bool resume) override;
  Status StorePage(const std::string& crawl_id, const std::vector<crawler::HubModel>& models,
                   const std::vector<crawler::Reject>& rejects, const std::optional<std::string>& next_url) override;
  Result<std::vector<std::string>> ModelsWithoutConfig(int64_t limit) override;
  Status StoreConfig(const std::string& model_id, crawler::ConfigStatus status, const std::string& reason,
                     const std::string& body) override;
  Status ForEachStoredModel(const std::function<Status(const crawler::HubModel&, std::optional<crawler::ConfigStatus>,
                                                       std::string_view)>& fn) override;

 private:
  std::mutex mu_;
  registry::Registry* registry_;
};

}  // namespace coverage::crawler
