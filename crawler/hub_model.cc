#include "crawler/hub_model.h"

#include "crawler/model_id.h"

namespace coverage::crawler {
namespace {

using nlohmann::json;

Status Field(const json& entry, const char* name, const std::string& who, json::value_t want, const char* what) {
  if (!entry.contains(name) || entry[name].is_null()) return Status::Ok();
  const json& v = entry[name];
  const bool ok = want == json::value_t::number_integer ? v.is_number_integer()
                  : want == json::value_t::string       ? v.is_string()
                  : want == json::value_t::boolean      ? v.is_boolean()
                  : want == json::value_t::array        ? v.is_array()
                  : want == json::value_t::object       ? v.is_object()
                                                          : false;
  if (!ok) return Status::InvalidArgument(who + ": field '" + name + "' must be " + what);
  return Status::Ok();
}

Result<std::string> OptString(const json& entry, const char* name, const std::string& who) {
  COV_RETURN_IF_ERROR(Field(entry, name, who, json::value_t::string, "a string"));
  return entry.contains(name) && entry[name].is_string() ? entry[name].get<std::string>() : std::string();
}

Result<int64_t> OptCount(const json& entry, const char* name, const std::string& who) {
  COV_RETURN_IF_ERROR(Field(entry, name, who, json::value_t::number_integer, "an integer"));
  if (!entry.contains(name) || entry[name].is_null()) return int64_t{0};
  const int64_t v = entry[name].get<int64_t>();
  if (v < 0) return Status::InvalidArgument(who + ": field '" + name + "' is negative");
  return v;
}

Result<std::vector<std::string>> OptStrings(const json& entry, const char* name, const std::string& who) {
  COV_RETURN_IF_ERROR(Field(entry, name, who, json::value_t::array, "an array of strings"));
  std::vector<std::string> out;
  if (!entry.contains(name) || entry[name].is_null()) return out;
  for (const auto& v : entry[name]) {
    if (!v.is_string()) return Status::InvalidArgument(who + ": field '" + name + "' must hold only strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

Result<HubModel> ParseHubModel(const json& entry) {
  if (!entry.is_object()) return Status::InvalidArgument("model entry is not a JSON object");
  if (!entry.contains("id") || !entry["id"].is_string()) {
    return Status::InvalidArgument("model entry has no string 'id'");
  }
  HubModel m;
  m.id = entry["id"].get<std::string>();
  COV_RETURN_IF_ERROR(ValidateModelId(m.id));
  const std::string who = "model '" + m.id + "'";
  COV_ASSIGN_OR_RETURN(m.author, OptString(entry, "author", who));
  COV_ASSIGN_OR_RETURN(m.sha, OptString(entry, "sha", who));
  COV_ASSIGN_OR_RETURN(m.downloads, OptCount(entry, "downloads", who));
  COV_ASSIGN_OR_RETURN(m.likes, OptCount(entry, "likes", who));
  COV_ASSIGN_OR_RETURN(m.tags, OptStrings(entry, "tags", who));
  COV_ASSIGN_OR_RETURN(m.pipeline_tag, OptString(entry, "pipeline_tag", who));
  COV_ASSIGN_OR_RETURN(m.library_name, OptString(entry, "library_name", who));
  COV_ASSIGN_OR_RETURN(m.created_at, OptString(entry, "createdAt", who));
  COV_ASSIGN_OR_RETURN(m.last_modified, OptString(entry, "lastModified", who));
  if (entry.contains("gated") && !entry["gated"].is_null()) {
    const json& g = entry["gated"];
    if (g.is_boolean()) {
      m.gated = g.get<bool>() ? "true" : "false";
    } else if (g.is_string() && (g == "auto" || g == "manual")) {
      m.gated = g.get<std::string>();
    } else {
      return Status::InvalidArgument(who + ": field 'gated' must be false, \"auto\" or \"manual\"");
    }
  }
  COV_RETURN_IF_ERROR(Field(entry, "private", who, json::value_t::boolean, "a boolean"));
  m.is_private = entry.contains("private") && entry["private"].is_boolean() && entry["private"].get<bool>();
  COV_RETURN_IF_ERROR(Field(entry, "config", who, json::value_t::object, "an object"));
  if (entry.contains("config") && entry["config"].is_object()) {
    const json& c = entry["config"];
    COV_ASSIGN_OR_RETURN(m.model_type, OptString(c, "model_type", who + " config"));
    COV_ASSIGN_OR_RETURN(m.architectures, OptStrings(c, "architectures", who + " config"));
  }
  if (m.author.empty()) {
    const size_t slash = m.id.find('/');
    if (slash != std::string::npos) m.author = m.id.substr(0, slash);
  }
  return m;
}

}  // namespace coverage::crawler
