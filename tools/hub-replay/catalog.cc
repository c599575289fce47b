#include "tools/hub-replay/catalog.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <queue>

#include "tools/hub-replay/json_text.h"

namespace coverage::hub_replay {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string ModelTypeOf(const ModelRecord& model) {
  if (!model.config_subset.is_object()) return "";
  const auto it = model.config_subset.find("model_type");
  return it != model.config_subset.end() && it->is_string() ? it->get<std::string>() : "";
}

bool HasFilters(const ListQuery& q) {
  return !q.search.empty() || !q.author.empty() || !q.filters.empty() || !q.pipeline_tag.empty() ||
         !q.library.empty() || q.gated.has_value();
}

Result<ListPage> RankOrderPage(const Catalog& catalog, const ListQuery& query, const std::string& sort_name,
                               int direction) {
  const int64_t n = catalog.size();
  int64_t start = 0;
  if (query.cursor) {
    if (query.cursor->position < 0 || query.cursor->position > n) {
      return Status::InvalidArgument("cursor points outside the listing");
    }
    start = query.cursor->position;
  }
  const bool filtered = HasFilters(query);
  ListPage page;
  for (int64_t pos = start; pos < n; ++pos) {
    const int64_t rank = query.descending ? pos : n - 1 - pos;
    if (static_cast<int64_t>(page.models.size()) == query.limit && !filtered) {
      page.next = Cursor{sort_name, direction, pos, "", -1};
      break;
    }
    const int64_t index = catalog.IndexAtRank(query.sort, rank);
    if (filtered && !catalog.Matches(index, query)) continue;
    // The page is full and another match exists: the next page starts here.
    if (static_cast<int64_t>(page.models.size()) == query.limit) {
      page.next = Cursor{sort_name, direction, pos, "", -1};
      break;
    }
    page.models.push_back(catalog.Record(index));
  }
  return page;
}

struct ScanItem {
  std::string key;
  int64_t index;
};

Result<ListPage> ScanOrderPage(const Catalog& catalog, const ListQuery& query, const std::string& sort_name,
                               int direction) {
  const int64_t n = catalog.size();
  std::optional<ScanItem> after;
  if (query.cursor) {
    if (query.cursor->position >= 0 || query.cursor->index >= n) {
      return Status::InvalidArgument("cursor points outside the listing");
    }
    after = ScanItem{query.cursor->key, query.cursor->index};
  }
  const bool descending = query.descending;
  // `Before(a, b)`: a is listed before b.
  auto before = [descending](const ScanItem& a, const ScanItem& b) {
    const int c = a.key.compare(b.key);
    if (c == 0) return descending ? a.index > b.index : a.index < b.index;
    return descending ? c > 0 : c < 0;
  };
  // Keeps the first limit+1 matches in listing order; the extra one says
  // whether a next page exists. The top of the heap is the last kept item.
  std::priority_queue<ScanItem, std::vector<ScanItem>, decltype(before)> kept(before);
  const size_t keep = static_cast<size_t>(query.limit) + 1;
  const bool filtered = HasFilters(query);
  for (int64_t i = 0; i < n; ++i) {
    ScanItem item{catalog.ScanKey(query.sort, i), i};
    if (after && !before(*after, item)) continue;
    if (kept.size() == keep && !before(item, kept.top())) continue;
    if (filtered && !catalog.Matches(i, query)) continue;
    kept.push(std::move(item));
    if (kept.size() > keep) kept.pop();
  }
  std::vector<ScanItem> items;
  items.reserve(kept.size());
  while (!kept.empty()) {
    items.push_back(kept.top());
    kept.pop();
  }
  std::reverse(items.begin(), items.end());
  ListPage page;
  if (items.size() > static_cast<size_t>(query.limit)) {
    items.resize(static_cast<size_t>(query.limit));
    page.next = Cursor{sort_name, direction, -1, items.back().key, items.back().index};
  }
  for (const ScanItem& item : items) page.models.push_back(catalog.Record(item.index));
  return page;
}

}  // namespace

std::string ToLower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<SortKey> ParseSortKey(std::string_view wire) {
  if (wire == "downloads") return SortKey::kDownloads;
  if (wire == "likes") return SortKey::kLikes;
  if (wire == "createdAt") return SortKey::kCreatedAt;
  if (wire == "lastModified") return SortKey::kLastModified;
  if (wire == "id") return SortKey::kId;
  return std::nullopt;
}

std::string SortKeyName(SortKey key) {
  switch (key) {
    case SortKey::kDownloads:
      return "downloads";
    case SortKey::kLikes:
      return "likes";
    case SortKey::kCreatedAt:
      return "createdAt";
    case SortKey::kLastModified:
      return "lastModified";
    case SortKey::kId:
      return "id";
  }
  return "downloads";
}

bool Matches(const ModelRecord& model, const ListQuery& query) {
  if (!query.search.empty()) {
    const std::string id = ToLower(model.id);
    for (const std::string& s : query.search) {
      if (id.find(s) == std::string::npos) return false;
    }
  }
  if (!query.author.empty() && ToLower(model.author) != query.author) return false;
  if (!query.pipeline_tag.empty() && model.pipeline_tag != query.pipeline_tag) return false;
  if (!query.library.empty() && model.library_name != query.library) return false;
  if (query.gated && model.gated.empty() == *query.gated) return false;
  if (!query.filters.empty()) {
    const std::string model_type = ModelTypeOf(model);
    for (const std::string& f : query.filters) {
      const bool hit = f == model_type || f == model.library_name || f == model.pipeline_tag ||
                       std::find(model.tags.begin(), model.tags.end(), f) != model.tags.end();
      if (!hit) return false;
    }
  }
  return true;
}

bool Catalog::Matches(int64_t index, const ListQuery& query) const { return hub_replay::Matches(Record(index), query); }

Result<ListPage> RunListQuery(const Catalog& catalog, const ListQuery& query) {
  if (query.limit < 1) return Status::InvalidArgument("limit must be at least 1");
  const std::string sort_name = SortKeyName(query.sort);
  const int direction = query.descending ? -1 : 1;
  if (query.cursor && (query.cursor->sort != sort_name || query.cursor->direction != direction)) {
    return Status::InvalidArgument("cursor belongs to another sort order");
  }
  if (catalog.HasRankOrder(query.sort)) return RankOrderPage(catalog, query, sort_name, direction);
  return ScanOrderPage(catalog, query, sort_name, direction);
}

nlohmann::ordered_json EntryJson(const ModelRecord& model, bool full, bool config) {
  nlohmann::ordered_json j;
  j["_id"] = model.mongo_id;
  j["id"] = model.id;
  if (full) {
    if (!model.author.empty()) j["author"] = model.author;
    j["sha"] = model.sha;
  }
  j["createdAt"] = model.created_at;
  if (full) j["lastModified"] = model.last_modified;
  j["private"] = model.is_private;
  if (full) {
    if (model.gated.empty()) {
      j["gated"] = false;
    } else {
      j["gated"] = model.gated;
    }
    j["disabled"] = model.disabled;
  }
  j["downloads"] = model.downloads;
  j["likes"] = model.likes;
  j["tags"] = model.tags;
  if (!model.pipeline_tag.empty()) j["pipeline_tag"] = model.pipeline_tag;
  if (!model.library_name.empty()) j["library_name"] = model.library_name;
  if (config && !model.config_subset.is_null()) j["config"] = model.config_subset;
  j["modelId"] = model.id;
  return j;
}

std::string PipelineTagFor(const std::string& architecture, const std::string& model_type) {
  const std::string_view a = architecture;
  if (a.empty()) return "";
  if (model_type == "whisper" || EndsWith(a, "ForCTC") || EndsWith(a, "ForSpeechSeq2Seq")) {
    return "automatic-speech-recognition";
  }
  if (EndsWith(a, "ForCausalLM") || EndsWith(a, "LMHeadModel")) return "text-generation";
  if (EndsWith(a, "ForConditionalGeneration")) {
    static const char* const kText2Text[] = {
        "t5",   "mt5",       "umt5", "longt5", "bart", "mbart", "pegasus", "marian", "switch_transformers",
        "fsmt", "prophetnet"};
    for (const char* t : kText2Text) {
      if (model_type == t) return "text2text-generation";
    }
    return "image-text-to-text";  // most other *ForConditionalGeneration classes are vision-language models
  }
  if (EndsWith(a, "MTModel")) return "translation";
  if (EndsWith(a, "ForMaskedLM") || EndsWith(a, "ForPreTraining")) return "fill-mask";
  if (EndsWith(a, "ForSequenceClassification")) return "text-classification";
  if (EndsWith(a, "ForTokenClassification")) return "token-classification";
  if (EndsWith(a, "ForQuestionAnswering")) return "question-answering";
  if (EndsWith(a, "ForImageClassification")) return "image-classification";
  if (EndsWith(a, "Model")) return "feature-extraction";
  return "";
}

Result<std::vector<ConfigEntry>> LoadConfigsJsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError("cannot open " + path);
  std::vector<ConfigEntry> entries;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    // Real configs hold Infinity and NaN: fields are read from a copy where
    // they are null, and the served bytes come from the line's own text.
    // nlohmann::json, not ordered_json: ordered_json inserts in linear time, and
    // real configs hold objects with thousands of members (id2label).
    const auto j = nlohmann::json::parse(ReplaceNonFiniteLiterals(line), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return Status::Corruption(where + ": not a JSON object");
    const auto id = j.find("id");
    const auto config = j.find("config");
    if (id == j.end() || !id->is_string() || config == j.end() || !config->is_object()) {
      return Status::Corruption(where + ": needs a string \"id\" and an object \"config\"");
    }
    const std::optional<std::string_view> config_text = TopLevelMember(line, "config");
    if (!config_text) return Status::Corruption(where + ": cannot find the text of \"config\"");
    Result<std::string> pretty = Reindent(*config_text);
    if (!pretty) return pretty.error().WithContext(where);
    ConfigEntry e;
    e.id = id->get<std::string>();
    e.bytes = *pretty + "\n";
    nlohmann::ordered_json subset = nlohmann::ordered_json::object();
    if (const auto a = config->find("architectures"); a != config->end() && a->is_array()) {
      subset["architectures"] = *a;
      if (!a->empty() && a->front().is_string()) e.architecture = a->front().get<std::string>();
    }
    if (const auto t = config->find("model_type"); t != config->end() && t->is_string()) {
      subset["model_type"] = *t;
      e.model_type = t->get<std::string>();
    }
    if (!subset.empty()) e.subset = std::move(subset);
    if (const auto r = j.find("revision"); r != j.end() && r->is_string()) e.revision = r->get<std::string>();
    entries.push_back(std::move(e));
  }
  if (in.bad()) return Status::IoError("error reading " + path);
  return entries;
}

std::string NormalizeTimestamp(const std::string& text) {
  // YYYY-MM-DD[ T]HH:MM:SS[.fraction](Z|+00:00)
  const std::string_view s = text;
  if (s.size() < 20) return text;
  const bool shape = AllDigits(s.substr(0, 4)) && s[4] == '-' && AllDigits(s.substr(5, 2)) && s[7] == '-' &&
                     AllDigits(s.substr(8, 2)) && (s[10] == ' ' || s[10] == 'T') && AllDigits(s.substr(11, 2)) &&
                     s[13] == ':' && AllDigits(s.substr(14, 2)) && s[16] == ':' && AllDigits(s.substr(17, 2));
  if (!shape) return text;
  size_t pos = 19;
  std::string millis = "000";
  if (pos < s.size() && s[pos] == '.') {
    size_t end = pos + 1;
    while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
    const std::string_view frac = s.substr(pos + 1, end - pos - 1);
    if (frac.empty()) return text;
    for (size_t i = 0; i < 3 && i < frac.size(); ++i) millis[i] = frac[i];
    pos = end;
  }
  const std::string_view zone = s.substr(pos);
  if (zone != "Z" && zone != "+00:00") return text;
  return std::string(s.substr(0, 10)) + "T" + std::string(s.substr(11, 8)) + "." + millis + "Z";
}

std::string FormatTimestamp(int64_t epoch_ms) {
  const time_t seconds = static_cast<time_t>(epoch_ms / 1000);
  struct tm tm {};
  gmtime_r(&seconds, &tm);
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(epoch_ms % 1000));
  return buffer;
}

}  // namespace coverage::hub_replay
