#include "capture/profiles.h"

#include <string>

namespace coverage::capture {

using json = nlohmann::json;

Result<std::vector<CaptureProfile>> ParseCaptureProfiles(const json& doc) {
  if (!doc.is_object() || !doc.contains("profiles") || !doc["profiles"].is_array()) {
    return Status::InvalidArgument("expected {\"profiles\": [...]}");
  }
  std::vector<CaptureProfile> out;
  for (size_t i = 0; i < doc["profiles"].size(); ++i) {
    const json& j = doc["profiles"][i];
    const std::string where = "profiles[" + std::to_string(i) + "]";
    CaptureProfile p;
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return Status::InvalidArgument(where + ": missing 'name'");
    p.name = j["name"].get<std::string>();
    if (!j.contains("families") || !j["families"].is_array()) return Status::InvalidArgument(where + " (" + p.name + "): missing 'families'");
    for (const auto& f : j["families"]) {
      if (!f.is_string()) return Status::InvalidArgument(where + " (" + p.name + "): 'families' must hold strings");
      p.families.push_back(f.get<std::string>());
    }
    for (const char* field : {"batch", "seq_len", "past_len"}) {
      if (j.contains(field) && (!j[field].is_number_integer() || j[field].get<int64_t>() < 0)) {
        return Status::InvalidArgument(where + " (" + p.name + "): '" + field + "' must be a non-negative integer");
      }
    }
    p.batch = j.value("batch", int64_t{1});
    p.seq_len = j.value("seq_len", int64_t{0});
    p.past_len = j.value("past_len", int64_t{0});
    if (p.batch < 1) return Status::InvalidArgument(where + " (" + p.name + "): 'batch' must be >= 1");
    if (j.contains("dtype") && !j["dtype"].is_string()) {
      return Status::InvalidArgument(where + " (" + p.name + "): 'dtype' must be a string such as \"f32\"");
    }
    auto dt = DTypeFromName(j.value("dtype", std::string("f32")));
    if (!dt || !IsFloatingDType(*dt)) return Status::InvalidArgument(where + " (" + p.name + "): 'dtype' must be f32, f64, f16 or bf16");
    p.dtype = *dt;
    if (j.contains("training") && !j["training"].is_boolean()) {
      return Status::InvalidArgument(where + " (" + p.name + "): 'training' must be true or false");
    }
    p.training = j.value("training", false);
    if (p.training && p.past_len > 0) {
      return Status::InvalidArgument(where + " (" + p.name + "): a training profile has no KV cache ('past_len' must be 0)");
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace coverage::capture
