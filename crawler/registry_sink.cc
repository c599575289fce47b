#include "crawler/registry_sink.h"

#include <nlohmann/json.hpp>

#include "registry/registry.h"

namespace coverage::crawler {

Result<std::optional<std::string>> RegistryCrawlSink::NextPage(const std::string& crawl_id, bool resume) {
  std::lock_guard<std::mutex> lock(mu_);
  if (resume) {
    COV_ASSIGN_OR_RETURN(auto state, registry_->GetCrawl(crawl_id));
    if (state) return state->next_url;
  }
  COV_RETURN_IF_ERROR(registry_->StartCrawl(crawl_id));
  return std::optional<std::string>(crawl_id);
}

Status RegistryCrawlSink::StorePage(const std::string& crawl_id, const std::vector<crawler::HubModel>& models,
                                    const std::vector<crawler::Reject>& rejects,
                                    const std::optional<std::string>& next_url) {
  std::vector<registry::HubModelRecord> rows;
  rows.reserve(models.size());
  for (const auto& m : models) {
    registry::HubModelRecord r;
    r.id = m.id;
    r.author = m.author;
    r.sha = m.sha;
    r.downloads = m.downloads;
    r.likes = m.likes;
    r.tags_json = nlohmann::json(m.tags).dump();
    r.pipeline_tag = m.pipeline_tag;
    r.library_name = m.library_name;
    r.created_at = m.created_at;
    r.last_modified = m.last_modified;
    r.gated = m.gated;
    r.is_private = m.is_private;
    r.model_type = m.model_type;
    r.architectures_json = nlohmann::json(m.architectures).dump();
    rows.push_back(std::move(r));
  }
  std::vector<std::pair<std::string, std::string>> rejected;
  for (const auto& r : rejects) rejected.emplace_back(r.raw, r.reason);
  std::lock_guard<std::mutex> lock(mu_);
  return registry_->StoreCrawlPage(crawl_id, rows, rejected, next_url);
}

Result<std::vector<std::string>> RegistryCrawlSink::ModelsWithoutConfig(int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  return registry_->ModelsWithoutConfig(limit);
}

Status RegistryCrawlSink::StoreConfig(const std::string& model_id, crawler::ConfigStatus status,
                                      const std::string& reason, const std::string& body) {
  std::lock_guard<std::mutex> lock(mu_);
  return registry_->StoreConfig(model_id, std::string(crawler::ConfigStatusName(status)), reason, body);
}

Status RegistryCrawlSink::ForEachStoredModel(
    const std::function<Status(const crawler::HubModel&, std::optional<crawler::ConfigStatus>, std::string_view)>& fn) {
  std::lock_guard<std::mutex> lock(mu_);
  crawler::HubModel m;
  return registry_->ForEachHubModel(
      [&](const registry::HubModelRecord& r, const std::string& status, const std::string& config) -> Status {
        m.id = r.id;
        m.author = r.author;
        m.sha = r.sha;
        m.downloads = r.downloads;
        m.likes = r.likes;
        m.pipeline_tag = r.pipeline_tag;
        m.library_name = r.library_name;
        m.created_at = r.created_at;
        m.last_modified = r.last_modified;
        m.gated = r.gated;
        m.is_private = r.is_private;
        m.model_type = r.model_type;
        auto tags = nlohmann::json::parse(r.tags_json, nullptr, false);
        auto archs = nlohmann::json::parse(r.architectures_json, nullptr, false);
        m.tags.clear();
        m.architectures.clear();
        if (tags.is_array()) {
          for (const auto& t : tags) {
            if (t.is_string()) m.tags.push_back(t.get<std::string>());
          }
        }
        if (archs.is_array()) {
          for (const auto& a : archs) {
            if (a.is_string()) m.architectures.push_back(a.get<std::string>());
          }
        }
        std::optional<crawler::ConfigStatus> cs;
        if (status == "fetched") cs = crawler::ConfigStatus::kFetched;
        if (status == "missing") cs = crawler::ConfigStatus::kMissing;
        if (status == "gated") cs = crawler::ConfigStatus::kGated;
        if (status == "invalid") cs = crawler::ConfigStatus::kInvalid;
        return fn(m, cs, config);
      });
}

}  // namespace coverage::crawler
