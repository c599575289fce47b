// Fuzz target: feature extraction from a config.json (ExtractFeatures,
// selection/features.h) with the real family defaults of
// data/transformers_defaults.jsonl, and the capped JSON reader under it
// (core/json_capped.h). Invariants: nothing escapes as an exception (the
// extractor's Internal); counts are never negative; ToJson/FeaturesFromJson
// round-trip exactly, through JSON text too; the signatures are computed;
// RawJsonMember finds each plain key of the re-written object and its text
// parses to that member.
#include <cstdlib>

#include "core/json_capped.h"
#include "fuzz/fuzz_check.h"
#include "selection/features.h"
#include "selection/signature.h"

namespace {

using namespace coverage;
using namespace coverage::selection;

const FamilyDefaults& Defaults() {
  static const std::shared_ptr<const FamilyDefaults> defaults = [] {
    const char* home = std::getenv("COVERAGE_HOME");
    const std::string path = std::string(home ? home : COVERAGE_FUZZ_HOME) + "/data/transformers_defaults.jsonl";
    auto loaded = FamilyDefaults::Load(path);
    FUZZ_CHECK(loaded.has_value(), loaded.error().ToString());
    return *loaded;
  }();
  return *defaults;
}

bool PlainKey(const std::string& key) {
  for (unsigned char c : key) {
    if (c < 0x20 || c == '"' || c == '\\' || c >= 0x7f) return false;
  }
  return true;
}

void CheckRawMembers(const nlohmann::json& object) {
  const std::string text = object.dump();
  for (const auto& [key, value] : object.items()) {
    if (!PlainKey(key)) continue;
    const auto raw = RawJsonMember(text, key);
    FUZZ_CHECK(raw.has_value(), "RawJsonMember misses '" + key + "' in " + text);
    auto parsed = ParseJsonCapped(*raw);
    FUZZ_CHECK(parsed.has_value() && *parsed == value, "RawJsonMember('" + key + "') = " + std::string(*raw));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::AsText(data, size);
  const FamilyDefaults& defaults = Defaults();

  auto parsed = ParseJsonCapped(text, {.python_literals = true});
  if (parsed && parsed->is_object()) CheckRawMembers(*parsed);

  auto f = ExtractFeatures(text, defaults);
  if (!f) {
    FUZZ_CHECK(f.error().code() == StatusCode::kInvalidArgument, f.error().ToString());
    return 0;
  }
  for (int64_t v : {f->heads, f->kv_heads, f->head_dim, f->sliding_window, f->experts, f->experts_per_token,
                    f->shared_experts, f->hidden, f->layers, f->encoder_layers, f->intermediate, f->vocab,
                    f->context, f->image_size, f->patch_size}) {
    FUZZ_CHECK(v >= 0, fuzz::Dump(ToJson(*f)));
  }
  const nlohmann::json j = ToJson(*f);
  auto again = FeaturesFromJson(j);
  FUZZ_CHECK(again.has_value() && *again == *f, fuzz::Dump(j));
  auto from_text = FeaturesFromJson(nlohmann::json::parse(j.dump()));
  FUZZ_CHECK(from_text.has_value() && *from_text == *f, j.dump());
  (void)SignatureHash(CoarseSignature(*f));
  (void)SignatureHash(FineSignature(*f));
  return 0;
}
