#include "selection/signature.h"

#include <bit>

#include "core/hash.h"

namespace coverage::selection {

int Bucket(int64_t x) { return x <= 0 ? 0 : std::bit_width(static_cast<uint64_t>(x)); }

std::string CoarseSignature(const Features& f) {
  std::string moe = f.experts > 0 ? (f.shared_experts > 0 ? "moe+shared" : "moe") : "dense";
  std::string towers = std::string(f.vision.hidden > 0 || f.vision.layers > 0 ? "v" : "") +
                       (f.audio.hidden > 0 || f.audio.layers > 0 || f.audio.mel_bins > 0 ? "a" : "");
  // Without a model type (remote code, old configs) the architecture class
  // names the family.
  const std::string family = f.model_type.empty() ? "arch:" + f.architecture : f.model_type;
  std::string s;
  bool first = true;
  for (const std::string& part :
       {family, f.head, f.structure, f.attention, f.position + (f.rope_scaling.empty() ? "" : ":" + f.rope_scaling),
        f.norm + (f.norm_placement.empty() ? "" : ":" + f.norm_placement),
        f.activation + (f.gated_mlp ? ":gated" : ""), moe, std::string(f.tied_embeddings ? "tied" : "untied"),
        std::string(f.sliding_window > 0 ? "swa" : "full"), f.quantization, towers}) {
    if (!first) s += '|';
    first = false;
    s += part;
  }
  return s;
}

std::string FineSignature(const Features& f) {
  std::string s = CoarseSignature(f);
  s += "|" + f.dtype;
  for (int64_t v : {f.hidden, f.layers, f.encoder_layers, f.heads, f.kv_heads, f.head_dim, f.intermediate, f.vocab,
                    f.context, f.experts, f.experts_per_token, f.sliding_window, f.image_size, f.patch_size,
                    f.vision.hidden, f.vision.layers, f.audio.hidden, f.audio.layers}) {
    s += '|';
    s += std::to_string(Bucket(v));
  }
  return s;
}

uint64_t SignatureHash(const std::string& signature) { return Fnv1a64(signature); }

}  // namespace coverage::selection
