#include "tools/hub-replay/real_catalog.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include "tools/hub-replay/permutation.h"

namespace coverage::hub_replay {
namespace {

constexpr char kEarliestCreatedAt[] = "2022-03-02T23:29:04.000Z";  // API.md §3: the Hub's lowest createdAt
constexpr uint32_t kEarliestCreatedAtSeconds = 0x621ffdc0;         // the same instant, as ObjectIds carry it

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

bool IsHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

uint64_t HashString(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a, then mixed
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return Mix64(h);
}

// Stand-ins for ids the data has no value for (see real_catalog.h).
std::string DerivedObjectId(const std::string& id) {
  return HexDigits(kEarliestCreatedAtSeconds, 8) + HexDigits(HashString(id), 16);
}

std::string DerivedSha(const std::string& id) {
  return HexDigits(HashString(id + "#sha1"), 16) + HexDigits(HashString(id + "#sha2"), 16) +
         HexDigits(HashString(id + "#sha3"), 8);
}

std::string StringField(const nlohmann::json& j, const char* name) {
  const auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

int64_t IntField(const nlohmann::json& j, const char* name) {
  const auto it = j.find(name);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

bool BoolField(const nlohmann::json& j, const char* name) {
  const auto it = j.find(name);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError("cannot open " + path);
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return Status::IoError("error reading " + path);
  return out.str();
}

Result<ModelRecord> ParseRecord(const std::string& line, const std::string& where) {
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(where + ": not a JSON object");
  ModelRecord m;
  m.id = StringField(j, "id");
  if (m.id.empty()) return Status::Corruption(where + ": no \"id\"");
  if (!IsPlausibleModelId(m.id)) return Status::InvalidArgument(where + ": id '" + m.id + "' breaks the Hub's rules");
  m.mongo_id = StringField(j, "_id");
  if (m.mongo_id.size() != 24 || !IsHex(m.mongo_id)) m.mongo_id = DerivedObjectId(m.id);
  m.author = StringField(j, "author");
  m.sha = StringField(j, "sha");
  if (m.sha.empty()) m.sha = DerivedSha(m.id);
  m.created_at = NormalizeTimestamp(StringField(j, "created_at"));
  if (m.created_at.empty()) m.created_at = kEarliestCreatedAt;
  m.last_modified = NormalizeTimestamp(StringField(j, "last_modified"));
  if (m.last_modified.empty()) m.last_modified = m.created_at;
  m.is_private = BoolField(j, "private");
  if (const auto g = j.find("gated"); g != j.end() && g->is_string()) m.gated = g->get<std::string>();
  m.disabled = BoolField(j, "disabled");
  m.downloads = IntField(j, "downloads");
  m.likes = IntField(j, "likes");
  m.library_name = StringField(j, "library_name");
  m.pipeline_tag = StringField(j, "pipeline_tag");
  if (const auto t = j.find("tags"); t != j.end() && t->is_array()) {
    for (const auto& tag : *t) {
      if (tag.is_string()) m.tags.push_back(tag.get<std::string>());
    }
  }
  if (const auto c = j.find("config"); c != j.end() && c->is_object()) {
    nlohmann::ordered_json subset = nlohmann::ordered_json::object();
    if (const auto a = c->find("architectures"); a != c->end()) subset["architectures"] = *a;
    if (const auto t = c->find("model_type"); t != c->end()) subset["model_type"] = *t;
    if (!subset.empty()) m.config_subset = std::move(subset);
  }
  return m;
}

ModelRecord RecordFromConfig(const ConfigEntry& c) {
  ModelRecord m;
  m.id = c.id;
  const size_t slash = c.id.find('/');
  if (slash != std::string::npos) m.author = c.id.substr(0, slash);
  m.mongo_id = DerivedObjectId(c.id);
  m.sha = c.revision.size() == 40 && IsHex(c.revision) ? c.revision : DerivedSha(c.id);
  m.created_at = kEarliestCreatedAt;
  m.last_modified = kEarliestCreatedAt;
  m.library_name = "transformers";
  m.pipeline_tag = PipelineTagFor(c.architecture, c.model_type);
  m.tags.push_back("transformers");
  if (!c.model_type.empty()) m.tags.push_back(c.model_type);
  if (!m.pipeline_tag.empty()) m.tags.push_back(m.pipeline_tag);
  m.config_subset = c.subset;
  return m;
}

class RealCatalog final : public Catalog {
 public:
  RealCatalog(std::vector<ModelRecord> models, std::vector<std::optional<std::string>> configs,
              std::unordered_map<std::string, std::string> redirects)
      : models_(std::move(models)), configs_(std::move(configs)), redirects_(std::move(redirects)) {
    for (size_t i = 0; i < models_.size(); ++i) by_id_.emplace(models_[i].id, static_cast<int64_t>(i));
    const std::pair<SortKey, std::function<bool(const ModelRecord&, const ModelRecord&)>> orders[] = {
        {SortKey::kDownloads, [](const auto& a, const auto& b) { return a.downloads > b.downloads; }},
        {SortKey::kLikes, [](const auto& a, const auto& b) { return a.likes > b.likes; }},
        {SortKey::kCreatedAt, [](const auto& a, const auto& b) { return a.created_at > b.created_at; }},
        {SortKey::kLastModified, [](const auto& a, const auto& b) { return a.last_modified > b.last_modified; }},
        {SortKey::kId, [](const auto& a, const auto& b) { return a.id > b.id; }},
    };
    for (const auto& [key, greater] : orders) {
      std::vector<int64_t>& order = ranks_[static_cast<int>(key)];
      order.resize(models_.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return greater(models_[a], models_[b]); });
    }
  }

  int64_t size() const override { return static_cast<int64_t>(models_.size()); }
  ModelRecord Record(int64_t index) const override { return models_[static_cast<size_t>(index)]; }
  std::string IdAt(int64_t index) const override { return models_[static_cast<size_t>(index)].id; }
  std::optional<int64_t> Find(std::string_view id) const override {
    const auto it = by_id_.find(std::string(id));
    if (it == by_id_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<std::string> ConfigBytes(int64_t index) const override { return configs_[static_cast<size_t>(index)]; }
  std::optional<std::string> RedirectTarget(std::string_view id) const override {
    const auto it = redirects_.find(std::string(id));
    if (it == redirects_.end()) return std::nullopt;
    return it->second;
  }
  bool HasRankOrder(SortKey) const override { return true; }
  int64_t IndexAtRank(SortKey key, int64_t rank) const override {
    return ranks_[static_cast<int>(key)][static_cast<size_t>(rank)];
  }
  std::string ScanKey(SortKey, int64_t index) const override { return IdAt(index); }  // unused: all rank orders

 private:
  std::vector<ModelRecord> models_;
  std::vector<std::optional<std::string>> configs_;
  std::unordered_map<std::string, std::string> redirects_;
  std::unordered_map<std::string, int64_t> by_id_;
  std::vector<int64_t> ranks_[5];
};

}  // namespace

bool IsPlausibleModelId(std::string_view id) {
  if (id.empty() || id.size() > 200) return false;
  if (id.find("--") != std::string_view::npos || id.find("..") != std::string_view::npos) return false;
  if (id.size() >= 4 && id.substr(id.size() - 4) == ".git") return false;
  const size_t slash = id.find('/');
  if (slash != std::string_view::npos && id.find('/', slash + 1) != std::string_view::npos) return false;
  const std::string_view name = slash == std::string_view::npos ? id : id.substr(slash + 1);
  if (name.size() > 96) return false;
  auto part_ok = [](std::string_view part) {
    if (part.empty() || !IsWordChar(part.front()) || !IsWordChar(part.back())) return false;
    return std::all_of(part.begin(), part.end(), [](char c) { return IsWordChar(c) || c == '-' || c == '.'; });
  };
  if (slash != std::string_view::npos && !part_ok(id.substr(0, slash))) return false;
  return part_ok(name);
}

Result<std::unique_ptr<Catalog>> LoadRealCatalog(const std::string& data_dir) {
  const std::string models_path = data_dir + "/models.jsonl";
  const std::string configs_path = data_dir + "/configs.jsonl";
  const std::string redirects_path = data_dir + "/redirects.json";

  COV_ASSIGN_OR_RETURN(const std::vector<ConfigEntry> configs, LoadConfigsJsonl(configs_path));
  COV_ASSIGN_OR_RETURN(const std::string models_text, ReadFile(models_path));
  COV_ASSIGN_OR_RETURN(const std::string redirects_text, ReadFile(redirects_path));

  std::vector<ModelRecord> models;
  std::unordered_map<std::string, size_t> index;
  std::istringstream lines(models_text);
  std::string line;
  int line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.empty()) continue;
    COV_ASSIGN_OR_RETURN(ModelRecord m, ParseRecord(line, models_path + ":" + std::to_string(line_no)));
    if (index.count(m.id))
      return Status::Corruption(models_path + ":" + std::to_string(line_no) + ": duplicate id " + m.id);
    index.emplace(m.id, models.size());
    models.push_back(std::move(m));
  }
  std::vector<std::optional<std::string>> config_bytes(models.size());
  for (const ConfigEntry& c : configs) {
    if (!IsPlausibleModelId(c.id))
      return Status::InvalidArgument(configs_path + ": id '" + c.id + "' breaks the Hub's rules");
    auto it = index.find(c.id);
    if (it == index.end()) {
      it = index.emplace(c.id, models.size()).first;
      models.push_back(RecordFromConfig(c));
      config_bytes.emplace_back();
    }
    models[it->second].has_config_file = true;
    config_bytes[it->second] = c.bytes;
  }

  const auto r = nlohmann::json::parse(redirects_text, nullptr, /*allow_exceptions=*/false);
  if (r.is_discarded() || !r.is_object() || !r.contains("redirects") || !r["redirects"].is_array()) {
    return Status::Corruption(redirects_path + ": expected {\"redirects\": [...]}");
  }
  std::unordered_map<std::string, std::string> redirects;
  for (const auto& entry : r["redirects"]) {
    const std::string from = entry.is_object() ? StringField(entry, "from") : "";
    const std::string to = entry.is_object() ? StringField(entry, "to") : "";
    if (!IsPlausibleModelId(from) || !IsPlausibleModelId(to)) {
      return Status::Corruption(redirects_path + ": each redirect needs valid \"from\" and \"to\" ids");
    }
    if (!index.count(from)) redirects.emplace(from, to);  // a served id is never redirected
  }
  return std::unique_ptr<Catalog>(
      std::make_unique<RealCatalog>(std::move(models), std::move(config_bytes), std::move(redirects)));
}

}  // namespace coverage::hub_replay
