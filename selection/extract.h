// The steps of ExtractFeatures, one per concern, and what they share.
// ExtractFeatures (features.cc) resolves the family and the stack, then runs
// the steps in the order below: each fills its part of Features and may read
// what an earlier step filled (the MLP width needs the experts, attention the
// structure). The order is also the order of Features::defaulted, so it is
// part of the result. Internal to selection/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "selection/config_reader.h"
#include "selection/features.h"

namespace coverage::selection::detail {

// What every sub-config reader needs.
struct Context {
  const FamilyDefaults& defaults;
  std::vector<std::string>* defaulted;  // Features::defaulted of the extraction
};

// The levels of one config.
struct Stack {
  const json* config = nullptr;    // the whole config.json (an object)
  const Family* family = nullptr;  // the top level's family; null when unknown
  Reader top;                      // the top level
  // The main (language or only) stack: a nested language model, else the top
  // level; the decoder of a generic EncoderDecoderModel.
  Reader main;
  std::string main_family;  // the main stack's family name, for the tables
  const json* text = nullptr;  // the nested language model's config (possibly empty), or null
  const json* encoder_sub = nullptr;  // EncoderDecoderModel's `encoder`, or null
  bool composite_seq2seq = false;     // EncoderDecoderModel: `encoder` and `decoder` configs
};

// What the structure step decides that later steps read.
struct Structure {
  bool enc_dec = false;            // an encoder-decoder model
  bool rwkv = false;               // RWKV (linear attention, squared ReLU)
  bool family_has_vision = false;  // the family's class has a vision_config
  const json* vision_sub = nullptr;
  const json* audio_sub = nullptr;
};

// An empty JSON object: the config of a sub-model left to its defaults.
const json& EmptyObject();

// A reader of the nested config `sub` under `key` ("text_config."), with its
// own family: its model_type, else the class its parent names for the key,
// else the parent's.
Reader SubReader(const Context& ctx, const json* sub, const json* fallback, const Family* parent,
                 std::string_view key);

// --- families and architecture names (family_defaults.cc)

// The family of a written model_type: exact, lowercased, '-' and '_'
// swapped, or a legacy name (feature_tables.json); null if none.
const Family* FindFamily(const FamilyDefaults& defaults, std::string_view model_type);
// The family of an architecture class name, legacy prefixes included.
const Family* FamilyFromArchitecture(const FamilyDefaults& defaults, std::string_view architecture);
// The task head: "AlbertForMaskedLM" -> "ForMaskedLM"; "BertModel" -> "Model".
std::string HeadOf(std::string_view architecture, const Family* family);

// --- the steps, in order

// Modality and block structure: Features::structure (extract_structure.cc).
Structure ReadStructure(Stack& s, Features* f);
// Mixture of experts: experts, experts_per_token, shared_experts (extract_dims.cc).
void ReadExperts(Reader& main, Features* f);
// The main stack's dimensions and conv widths (extract_dims.cc).
void ReadDimensions(const Context& ctx, Stack& s, const Structure& st, Features* f);
// Attention kind, KV heads, head width, sliding window (extract_attention.cc).
void ReadAttention(Reader& main, const Structure& st, Features* f);
// Position scheme and rope scaling (extract_attention.cc).
void ReadPosition(const FamilyDefaults& defaults, Stack& s, Features* f);
// Norm kind and placement (extract_norm.cc).
void ReadNorm(Stack& s, Features* f);
// Activation and gated MLP (extract_activation.cc).
void ReadActivation(Stack& s, const Structure& st, Features* f);
// Tied input and output embeddings (extract_structure.cc).
void ReadTiedEmbeddings(Stack& s, Features* f);
// Vision and audio towers (extract_structure.cc).
void ReadTowers(const Context& ctx, Stack& s, const Structure& st, Features* f);
// dtype and quantization (extract_numerics.cc).
void ReadNumerics(const Stack& s, Features* f);

// --- helpers shared by the steps

// Whether any rope key is named (extract_attention.cc).
bool NamesRope(Reader& r);
// The dimensions of a tower, or of a vision model's own stack (extract_dims.cc).
Tower ReadTower(Reader& r);

}  // namespace coverage::selection::detail
