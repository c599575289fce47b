// The encoder-only and encoder-decoder families of the model builder
// (model_builder.h).
//
// Encoder-only ("encoder"): encoders with BERT's layout, each with the
// embeddings, attention and head its transformers class runs:
//   - BERT, ERNIE, Megatron-BERT: word + token type + learned absolute
//     positions, embedding LayerNorm, post-norm layers (pre-norm with a final
//     LayerNorm where the family or config says so), GELU/ReLU MLP, padding
//     mask, pooler; BERT's relative_key / relative_key_query distance
//     embeddings when position_embedding_type names them;
//   - RoBERTa, XLM-RoBERTa, CamemBERT, Data2Vec-text, XLM-RoBERTa-XL,
//     RoBERTa-PreLayerNorm: position ids counted from the input ids past the
//     padding index (ne, cumsum), their classification and LM heads;
//   - ELECTRA (embedding_size, embeddings_project, discriminator head),
//     ALBERT (factorized embedding then embedding_hidden_mapping_in; layer
//     weights shared across layers, so the same weights run `max_layers`
//     times), DistilBERT (its own attention with masked_fill and no token
//     types), MPNet (T5-style relative position buckets added in every layer);
//   - DeBERTa-v2/v3: disentangled attention as transformers runs it: log
//     buckets of relative positions (position_buckets, max_relative_positions),
//     LayerNorm of the relative embeddings (norm_rel_ebd), shared or separate
//     position projections (share_att_key), c2p and p2c scores gathered from
//     the relative positions (pos_att_type), the convolution after the first
//     layer (conv_kernel_size), the embedding mask.
//   Heads by features.head: Model (pooler where the family has one),
//   ForMaskedLM, ForSequenceClassification, ForTokenClassification,
//   ForQuestionAnswering, ForPreTraining (BERT, ALBERT, ELECTRA).
//   Encoders take prefill-like profiles: seq_len tokens (capped at the
//   position table); a profile's past_len is ignored, since an encoder has no
//   KV cache.
//
// Encoder-decoder ("encoder-decoder"):
//   - T5, mT5 (and UMT5, whose every layer has its own relative bias):
//     T5LayerNorm (RMS, no mean or bias), relative attention bias from
//     relative_attention_num_buckets / relative_attention_max_distance
//     computed in the first layer of each stack (bidirectional in the
//     encoder, causal in the decoder) and reused by the later ones, unscaled
//     scores, ReLU or gated-GELU feed-forward per feed_forward_proj, the fp16
//     clamp, the tied-embedding rescale before the LM head;
//   - the BART family, with the layout each class hard-codes (its modeling
//     code does not read normalize_before): BART, PLBart, MVP and
//     Blenderbot-small (post-norm, layernorm_embedding), mBART (pre-norm,
//     layernorm_embedding, final LayerNorms), Marian (sinusoidal table,
//     post-norm), Pegasus (sinusoidal, pre-norm), Blenderbot (learned, pre-
//     norm), M2M-100/NLLB (sinusoidal positions from the input ids, pre-norm);
//     learned positions with BART's offset of 2, scale_embedding, the final
//     logits bias.
//   Prefill: the encoder runs profile.seq_len tokens and the decoder, teacher
//   forced, min(seq_len, 16) tokens with a causal mask and cross-attention
//   over the encoder output; logits for every decoder token (both capped at a
//   position table). Decode (past_len > 0): one decoder step of seq_len
//   tokens over a self-attention KV cache of past_len, with cross-attention
//   K/V computed before recording from an encoder output of
//   min(past_len + 1, context) tokens, as generation caches them; the encoder
//   does not run.
//
// Not built, with the reason in the plan: other encoder families (rotary
// encoders such as ESM, ModernBERT, NomicBERT; Funnel, XLNet, Longformer,
// ...), DeBERTa v1, gated-MLP encoders, ALBERT with several layers per
// group, heads other than the ones above, LongT5, Switch Transformers,
// NLLB-MoE, LED and the other seq2seq families.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "runners/dtype_map.h"
#include "runners/model_builder_internal.h"

namespace coverage::runners::builder {
namespace {

bool OneOf(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (s == n) return true;
  }
  return false;
}

// Like ConfigInt, but 0 is a value (type_vocab_size 0: no token types;
// pad_token_id 0).
int64_t ConfigCount(const json& c, const char* key, int64_t fallback) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer()) return fallback;
  const int64_t v = it->get<int64_t>();
  return v >= 0 && v <= (int64_t{1} << 40) ? v : fallback;
}

std::string ConfigString(const json& c, const char* key, const std::string& fallback) {
  auto it = c.find(key);
  return it != c.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// Labels of a classification head: id2label's size, num_labels, else 2.
int64_t Labels(const json& c) {
  auto it = c.find("id2label");
  if (it != c.end() && it->is_object() && !it->empty()) return static_cast<int64_t>(it->size());
  return ConfigInt(c, "num_labels", 2);
}

int64_t LayersBuilt(int64_t total, const BuildOptions& options) {
  return std::min(total, std::max<int64_t>(1, options.max_layers));
}

std::string BudgetReason(double bytes, int64_t built, int64_t total, double max_bytes) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "needs about %.3g GB for %lld of %lld layers, over the %.3g GB budget", bytes / 1e9,
                static_cast<long long>(built), static_cast<long long>(total), max_bytes / 1e9);
  return buf;
}

// Activations of the families here: the shared ones plus tanh (DeBERTa's
// conv_act default).
bool KnownAct(const std::string& a) { return KnownActivation(a) || a == "tanh"; }
at::Tensor Act(const at::Tensor& x, const std::string& a) { return a == "tanh" ? at::tanh(x) : Activate(x, a); }

std::string NormalisedAct(const std::string& raw) {
  if (OneOf(raw, {"gelu_new", "gelu_fast", "gelu_pytorch_tanh"})) return "gelu_tanh";
  if (raw == "swish") return "silu";
  return raw;
}

Linear MakeLinear(const Weights& W, int64_t out, int64_t in, bool bias = true) {
  return Linear{W({out, in}), bias ? W({out}) : at::Tensor()};
}


// [B, S, h * d] -> [B, h, S, d].
at::Tensor SplitHeads(const at::Tensor& t, int64_t heads) {
  return t.view({t.size(0), t.size(1), heads, -1}).transpose(1, 2);
}

// [B, h, S, d] -> [B, S, h * d].
at::Tensor MergeHeads(const at::Tensor& t) {
  return t.transpose(1, 2).contiguous().reshape({t.size(0), t.size(2), t.size(1) * t.size(3)});
}

// BERT's get_extended_attention_mask (T5's invert_attention_mask):
// (1 - mask[:, None, None, :]) * lowest, [B, 1, 1, S].
at::Tensor ExtendedMask(const at::Tensor& mask, at::ScalarType dt) {
  return at::rsub(mask.unsqueeze(1).unsqueeze(2).to(dt), 1.0) * Lowest(dt);
}

// transformers' _prepare_4d_attention_mask (BART family): [B, 1, tgt, S].
at::Tensor Expanded4dMask(const at::Tensor& mask, int64_t tgt, at::ScalarType dt) {
  at::Tensor expanded = mask.unsqueeze(1).unsqueeze(2).expand({mask.size(0), 1, tgt, mask.size(1)}).to(dt);
  at::Tensor inverted = at::rsub(expanded, 1.0);
  return inverted.masked_fill(inverted.to(at::kBool), Lowest(dt));
}

// Causal additive mask for `q` new tokens after `past`: [1, 1, q, past + q].
at::Tensor CausalMask(int64_t q, int64_t past, at::ScalarType dt) {
  return at::full({q, past + q}, Lowest(dt), at::TensorOptions().dtype(dt)).triu(past + 1).unsqueeze(0).unsqueeze(0);
}

// RoBERTa's create_position_ids_from_input_ids: positions count non-padding
// tokens, starting past the padding index.
at::Tensor PositionIdsFromInputIds(const at::Tensor& ids, int64_t pad, int64_t past = 0) {
  at::Tensor mask = ids.ne(pad).to(at::kInt);
  at::Tensor count = at::cumsum(mask, 1).type_as(mask);
  if (past > 0) count = count + past;
  return (count * mask).to(at::kLong) + pad;
}

// T5's _relative_position_bucket (MPNet's relative_position_bucket is the
// bidirectional case written with n = -relative_position).
at::Tensor RelativeBucket(at::Tensor rel, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  at::Tensor buckets;
  if (bidirectional) {
    num_buckets /= 2;
    buckets = (rel > 0).to(at::kLong) * num_buckets;
    rel = at::abs(rel);
  } else {
    rel = -at::min(rel, at::zeros_like(rel));
  }
  const int64_t max_exact = num_buckets / 2;
  at::Tensor is_small = rel < max_exact;
  at::Tensor large = max_exact + (at::log(rel.to(at::kFloat) / static_cast<double>(max_exact)) /
                                  std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                                  static_cast<double>(num_buckets - max_exact))
                                     .to(at::kLong);
  large = at::min(large, at::full_like(large, num_buckets - 1));
  at::Tensor chosen = at::where(is_small, rel, large);
  return buckets.defined() ? buckets + chosen : chosen;
}

// T5's compute_bias: [1, heads, q, k] for queries at `first_query`.. and
// keys 0..k-1, from the bucket embedding `table` [buckets, heads].
at::Tensor RelativeBias(const at::Tensor& table, int64_t q, int64_t first_query, int64_t k, bool bidirectional,
                        int64_t num_buckets, int64_t max_distance) {
  at::Tensor context = at::arange(first_query, first_query + q, at::kLong).unsqueeze(1);
  at::Tensor memory = at::arange(0, k, at::kLong).unsqueeze(0);
  at::Tensor buckets = RelativeBucket(memory - context, bidirectional, num_buckets, max_distance);
  return at::embedding(table, buckets).permute({2, 0, 1}).unsqueeze(0);
}

// DeBERTa-v2's make_log_bucket_position.
at::Tensor LogBucketPosition(const at::Tensor& rel, int64_t bucket_size, int64_t max_position) {
  at::Tensor sign = at::sign(rel);
  const int64_t mid = bucket_size / 2;
  at::Tensor abs_pos =
      at::where((rel < mid).bitwise_and(rel > -mid), at::scalar_tensor(mid - 1, at::kLong).type_as(rel), at::abs(rel));
  at::Tensor log_pos =
      at::ceil(at::log(abs_pos / static_cast<double>(mid)) /
               at::log(at::scalar_tensor(static_cast<double>(max_position - 1) / static_cast<double>(mid))) *
               static_cast<double>(mid - 1)) +
      static_cast<double>(mid);
  return at::where(abs_pos <= mid, rel.type_as(log_pos), log_pos * sign);
}

// DeBERTa-v2's build_relative_position: [1, q, k].
at::Tensor BuildRelativePosition(int64_t q, int64_t k, int64_t bucket_size, int64_t max_position) {
  at::Tensor rel = at::arange(0, q, at::kLong).unsqueeze(1) - at::arange(0, k, at::kLong).unsqueeze(0);
  if (bucket_size > 0 && max_position > 0) rel = LogBucketPosition(rel, bucket_size, max_position);
  return rel.to(at::kLong).slice(0, 0, q).unsqueeze(0);
}

// A fixed sinusoidal table [n, dim] (Marian / Pegasus / M2M-100 layout: sin
// in the first half, cos in the second); made before recording.
at::Tensor SinusoidalTable(int64_t n, int64_t dim, at::ScalarType dt) {
  const int64_t half = dim / 2;
  at::Tensor pos = at::arange(0, n, at::kFloat).unsqueeze(1);
  at::Tensor freq = at::exp(at::arange(0, half, at::kFloat) * (-std::log(10000.0) / std::max<double>(1.0, half - 1.0)));
  at::Tensor angles = pos * freq.unsqueeze(0);
  at::Tensor table = at::cat({at::sin(angles), at::cos(angles)}, 1);
  if (table.size(1) < dim) table = at::cat({table, at::zeros({n, dim - table.size(1)})}, 1);
  return table.to(dt);
}

// ---------------------------------------------------------------------------
// Encoder-only

enum class EncoderLayout { kBert, kDistilBert, kDeberta };

// What an encoder runs, from its features and config. Plan and Run both
// derive it, so they cannot disagree.
struct EncoderSpec {
  std::string reason;  // non-empty: not buildable, and why
  std::string type;
  EncoderLayout layout = EncoderLayout::kBert;
  // "model", "mlm", "seq", "token", "qa", "pretrain"
  std::string head;
  std::string mlm_style;  // "bert", "roberta", "electra", "albert", "distilbert"
  std::string seq_style;  // "pooler", "tanh_head", "gelu_head", "distilbert", "context_pooler"
  bool pooler = false;    // the base model's pooler runs (Model, pooler heads)
  int64_t hidden = 0, heads = 0, head_dim = 0, inter = 0, vocab = 0, context = 0;
  int64_t embedding = 0;   // embedding width (ALBERT, ELECTRA, DeBERTa)
  int64_t types = 0;       // token type vocabulary (0: none)
  int64_t task_types = 0;  // ERNIE's task type embeddings (0: none)
  int64_t groups = 1;      // ALBERT: distinct layer weights
  int64_t labels = 2;
  int64_t pad = -1;  // >= 0: RoBERTa-style position ids from the input ids
  bool absolute = true;
  std::string relative;  // "", "relative_key", "relative_key_query", "deberta", "mpnet"
  bool pre_norm = false, embed_norm = true;
  double eps = 1e-12;
  std::string act;
  int64_t max_tokens = 0;  // longest sequence the position tables allow (0: no limit)
  // DeBERTa-v2
  bool c2p = false, p2c = false, share_att_key = false, norm_rel = false;
  int64_t buckets = 0, max_relative = 0, span = 0;
  int64_t conv_kernel = 0, conv_groups = 1;
  std::string conv_act;
  int64_t pooler_hidden = 0;
  std::string pooler_act;
  // MPNet: its table has relative_attention_num_buckets rows, but
  // compute_position_bias buckets with its default of 32.
  int64_t rel_buckets = 32;
};

EncoderSpec EncoderSpecOf(const selection::Features& f, const json& c) {
  EncoderSpec sp;
  const std::string& t = f.model_type;
  sp.type = t;
  auto refuse = [&](std::string why) {
    sp.reason = std::move(why);
    return sp;
  };
  const bool bert_like = OneOf(t, {"bert", "ernie", "megatron-bert"});
  const bool roberta_like =
      OneOf(t, {"roberta", "xlm-roberta", "camembert", "data2vec-text", "xlm-roberta-xl", "roberta-prelayernorm"});
  const bool known = bert_like || roberta_like || OneOf(t, {"electra", "albert", "distilbert", "deberta-v2", "mpnet"});
  if (t == "deberta") {
    return refuse(
        "DeBERTa v1's attention (fused in_proj, separate q/v biases, p2p) is not built yet (DeBERTa-v2/v3 is)");
  }
  if (!known) {
    return refuse("encoder family '" + (t.empty() ? std::string("unknown") : t) +
                  "' is not built (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, ALBERT, DistilBERT, DeBERTa-v2, "
                  "MPNet, ERNIE and Megatron-BERT are)");
  }
  if (f.hidden <= 0 || f.layers <= 0 || f.heads <= 0 || f.vocab <= 0 || f.intermediate <= 0) {
    return refuse("hidden size, layers, heads, vocabulary or intermediate size unknown");
  }
  if (!f.quantization.empty()) return refuse("quantized weights (" + f.quantization + ") are not built");
  if (f.norm != "layernorm") return refuse("norm kind '" + f.norm + "' is not built for encoders (LayerNorm is)");
  if (f.norm_placement != "post" && f.norm_placement != "pre") return refuse("norm placement unknown");
  if (f.gated_mlp) return refuse("gated-MLP encoders are not built yet");
  if (f.experts > 0) return refuse("mixture-of-experts encoders are not built yet");
  sp.act = f.activation;
  if (!KnownAct(sp.act)) return refuse("activation '" + sp.act + "' is not built");
  sp.hidden = f.hidden;
  sp.heads = f.heads;
  sp.inter = f.intermediate;
  sp.vocab = f.vocab;
  sp.context = f.context;
  sp.pre_norm = f.norm_placement == "pre";
  sp.embedding = f.hidden;
  sp.labels = Labels(c);

  // Head.
  const std::string& h = f.head;
  if (h == "Model" || h.empty()) {
    sp.head = "model";
  } else if (h == "ForMaskedLM") {
    sp.head = "mlm";
  } else if (h == "ForSequenceClassification") {
    sp.head = "seq";
  } else if (h == "ForTokenClassification") {
    sp.head = "token";
  } else if (h == "ForQuestionAnswering") {
    sp.head = "qa";
  } else if (h == "ForPreTraining" && OneOf(t, {"bert", "ernie", "megatron-bert", "albert", "electra"})) {
    sp.head = "pretrain";
  } else {
    return refuse("head '" + h + "' of " + t +
                  " is not built (Model, ForMaskedLM, ForSequenceClassification, ForTokenClassification, "
                  "ForQuestionAnswering and BERT/ALBERT/ELECTRA ForPreTraining are)");
  }

  // Family layout.
  const int64_t default_types = OneOf(t, {"distilbert", "mpnet", "deberta-v2"}) ? 0 : 2;
  sp.types = OneOf(t, {"distilbert", "mpnet"}) ? 0 : ConfigCount(c, "type_vocab_size", default_types);
  sp.eps = ConfigNumber(c, "layer_norm_eps", t == "deberta-v2" ? 1e-7 : 1e-12);
  if (roberta_like || t == "mpnet") sp.pad = ConfigCount(c, "pad_token_id", 1);
  // Megatron-BERT and XLM-RoBERTa-XL normalise inside the layers only.
  sp.embed_norm = !OneOf(t, {"megatron-bert", "xlm-roberta-xl"});
  if (bert_like || t == "albert") {
    sp.pooler = sp.head == "model" || sp.head == "seq" || sp.head == "pretrain";
    sp.mlm_style = t == "albert" ? "albert" : "bert";
    sp.seq_style = "pooler";
  } else if (roberta_like || t == "mpnet") {
    sp.pooler = sp.head == "model";
    sp.mlm_style = "roberta";
    sp.seq_style = "tanh_head";
  } else if (t == "electra") {
    sp.mlm_style = "electra";
    sp.seq_style = "gelu_head";
  } else if (t == "distilbert") {
    sp.layout = EncoderLayout::kDistilBert;
    sp.mlm_style = "distilbert";
    sp.seq_style = "distilbert";
    sp.eps = 1e-12;  // hard-coded in DistilBERT
  } else {           // deberta-v2
    sp.layout = EncoderLayout::kDeberta;
    sp.mlm_style = "bert";
    sp.seq_style = "context_pooler";
  }
  if (t == "ernie" && ConfigBool(c, "use_task_id", false)) sp.task_types = ConfigInt(c, "task_type_vocab_size", 3);
  if (t == "albert" || t == "electra" || t == "deberta-v2") sp.embedding = ConfigInt(c, "embedding_size", f.hidden);
  if (t == "albert") {
    sp.groups = ConfigInt(c, "num_hidden_groups", 1);
    if (ConfigInt(c, "inner_group_num", 1) != 1) return refuse("ALBERT with several layers per group is not built yet");
    if (sp.groups > f.layers) return refuse("ALBERT with more layer groups than layers");
  }

  // Attention shape.
  sp.head_dim = t == "deberta-v2" ? ConfigInt(c, "attention_head_size", f.hidden / f.heads) : f.hidden / f.heads;
  if (t != "deberta-v2" && f.hidden % f.heads != 0) return refuse("hidden size is not a multiple of the heads");
  if (sp.head_dim <= 0) return refuse("head dimension unknown");

  // Positions.
  if (t == "deberta-v2") {
    sp.absolute = ConfigBool(c, "position_biased_input", true);
    if (ConfigBool(c, "relative_attention", false)) {
      sp.relative = "deberta";
      sp.buckets = ConfigInt(c, "position_buckets", 0);
      sp.max_relative = ConfigInt(c, "max_relative_positions", 0);
      if (sp.max_relative <= 0) sp.max_relative = f.context;
      sp.span = sp.buckets > 0 ? sp.buckets : sp.max_relative;
      if (sp.span <= 0) return refuse("DeBERTa relative attention without position_buckets or a context length");
      std::string types;
      if (auto it = c.find("pos_att_type"); it != c.end()) {
        if (it->is_string()) {
          types = it->get<std::string>();
        } else if (it->is_array()) {
          for (const auto& v : *it) {
            if (v.is_string()) types += v.get<std::string>() + "|";
          }
        }
      }
      std::transform(types.begin(), types.end(), types.begin(), [](unsigned char ch) { return std::tolower(ch); });
      sp.c2p = types.find("c2p") != std::string::npos;
      sp.p2c = types.find("p2c") != std::string::npos;
      sp.share_att_key = ConfigBool(c, "share_att_key", false);
      sp.norm_rel = ConfigString(c, "norm_rel_ebd", "none").find("layer_norm") != std::string::npos;
    }
    sp.conv_kernel = ConfigInt(c, "conv_kernel_size", 0);
    if (sp.conv_kernel > 0) {
      sp.conv_groups = ConfigInt(c, "conv_groups", 1);
      sp.conv_act = NormalisedAct(ConfigString(c, "conv_act", "tanh"));
      if (!KnownAct(sp.conv_act)) return refuse("DeBERTa conv_act '" + sp.conv_act + "' is not built");
      if (sp.hidden % sp.conv_groups != 0) return refuse("DeBERTa conv_groups does not divide the hidden size");
    }
    sp.pooler_hidden = ConfigInt(c, "pooler_hidden_size", f.hidden);
    sp.pooler_act = NormalisedAct(ConfigString(c, "pooler_hidden_act", "gelu"));
    if (!KnownAct(sp.pooler_act)) return refuse("DeBERTa pooler_hidden_act '" + sp.pooler_act + "' is not built");
  } else if (t == "mpnet") {
    sp.relative = "mpnet";
    sp.rel_buckets = ConfigInt(c, "relative_attention_num_buckets", 32);
  } else if (t == "distilbert") {
    if (f.position != "learned" && f.position != "sinusoidal") {
      return refuse("DistilBERT position scheme '" + f.position + "' is not built");
    }
  } else {
    const std::string pet = ConfigString(c, "position_embedding_type", "absolute");
    if (pet == "relative_key" || pet == "relative_key_query") {
      sp.relative = pet;
      sp.absolute = false;
    } else if (pet != "absolute") {
      return refuse("position_embedding_type '" + pet +
                    "' is not built (absolute, relative_key and "
                    "relative_key_query are)");
    }
    if (f.position != "learned" && f.position != "relative") {
      return refuse("position scheme '" + f.position + "' is not built for " + t);
    }
  }
  const bool needs_table =
      sp.absolute || sp.relative == "relative_key" || sp.relative == "relative_key_query" || sp.relative == "mpnet";
  if (needs_table) {
    if (f.context <= 0) return refuse("learned positions without a context length");
    sp.max_tokens = sp.pad >= 0 ? f.context - sp.pad - 1 : f.context;
    if (sp.max_tokens <= 0) return refuse("the position table is too short for the padding index");
  }
  return sp;
}

int64_t EncoderTokens(const EncoderSpec& sp, const CaptureProfile& profile) {
  const int64_t s = std::max<int64_t>(1, profile.seq_len);
  return sp.max_tokens > 0 ? std::min(s, sp.max_tokens) : s;
}

struct EncoderLayer {
  Linear q, k, v, o, up, down, pos_q, pos_k;
  Norm ln1, ln2;
  at::Tensor distance;  // BERT relative_key: [2 * context - 1, head_dim]
};

// ---------------------------------------------------------------------------
// Encoder-decoder

// What a seq2seq model runs, from its features and config.
struct Seq2SeqSpec {
  std::string reason;
  std::string type;
  bool t5 = false;
  std::string head;  // "lm", "model", "encoder"
  int64_t hidden = 0, vocab = 0, dec_vocab = 0, context = 0;
  int64_t enc_heads = 0, dec_heads = 0, enc_head_dim = 0, dec_head_dim = 0, enc_ffn = 0, dec_ffn = 0;
  int64_t enc_total = 0, dec_total = 0;
  std::string act;
  bool gated = false;
  double eps = 1e-5;
  // T5
  int64_t buckets = 32, max_distance = 128;
  bool bias_every_layer = false;
  // BART family
  std::string positions;  // "learned", "sinusoidal", "sinusoidal_ids" (M2M-100: from the input ids)
  int64_t pos_offset = 0, pad = 1;
  bool pre_norm = false, embed_norm = false, final_norm = false, logits_bias = false;
  double embed_scale = 1.0;
  bool separate_decoder_embed = false;  // Marian without shared embeddings
};

Seq2SeqSpec Seq2SeqSpecOf(const selection::Features& f, const json& c) {
  Seq2SeqSpec sp;
  const std::string& t = f.model_type;
  sp.type = t;
  auto refuse = [&](std::string why) {
    sp.reason = std::move(why);
    return sp;
  };
  sp.t5 = OneOf(t, {"t5", "mt5", "umt5"});
  const bool bart_family =
      OneOf(t, {"bart", "plbart", "mvp", "mbart", "marian", "pegasus", "blenderbot", "blenderbot-small", "m2m_100"});
  if (!sp.t5 && !bart_family) {
    return refuse("encoder-decoder family '" + (t.empty() ? std::string("unknown") : t) +
                  "' is not built (T5, mT5, UMT5, BART, PLBart, MVP, mBART, Marian, Pegasus, Blenderbot and "
                  "M2M-100 are)");
  }
  if (f.hidden <= 0 || f.layers <= 0 || f.encoder_layers <= 0 || f.heads <= 0 || f.vocab <= 0 || f.intermediate <= 0) {
    return refuse("hidden size, encoder or decoder layers, heads, vocabulary or intermediate size unknown");
  }
  if (!f.quantization.empty()) return refuse("quantized weights (" + f.quantization + ") are not built");
  if (f.experts > 0) return refuse("mixture-of-experts seq2seq models are not built yet");
  sp.act = f.activation;
  if (!KnownAct(sp.act)) return refuse("activation '" + sp.act + "' is not built");
  sp.gated = f.gated_mlp;
  sp.hidden = f.hidden;
  sp.vocab = sp.dec_vocab = f.vocab;
  sp.enc_total = f.encoder_layers;
  sp.dec_total = f.layers;
  sp.dec_heads = f.heads;
  sp.dec_ffn = f.intermediate;

  const std::string& h = f.head;
  if (h == "ForConditionalGeneration" || h == "MTModel") {
    sp.head = "lm";
  } else if (h == "Model" || h.empty()) {
    sp.head = "model";
  } else if (h == "EncoderModel" && sp.t5) {
    sp.head = "encoder";
  } else {
    return refuse("head '" + h + "' of " + t + " is not built (ForConditionalGeneration, Model" +
                  (sp.t5 ? std::string(", EncoderModel") : std::string(", MTModel")) + " are)");
  }

  if (sp.t5) {
    if (f.norm != "rmsnorm") return refuse("T5 without T5LayerNorm");
    if (f.position != "relative") return refuse("T5 position scheme '" + f.position + "' is not built");
    sp.enc_heads = f.heads;
    sp.enc_head_dim = sp.dec_head_dim = ConfigInt(c, "d_kv", f.head_dim > 0 ? f.head_dim : f.hidden / f.heads);
    sp.enc_ffn = f.intermediate;
    // T5Stack reads num_layers and num_decoder_layers (the latter defaulting
    // to the former), whatever else a config writes (a tiny test config has
    // encoder_layers 2 beside num_layers 6).
    sp.enc_total = ConfigInt(c, "num_layers", f.encoder_layers);
    sp.dec_total = ConfigInt(c, "num_decoder_layers", c.contains("num_layers") ? sp.enc_total : f.layers);
    sp.eps = ConfigNumber(c, "layer_norm_epsilon", 1e-6);
    sp.buckets = ConfigInt(c, "relative_attention_num_buckets", 32);
    sp.max_distance = ConfigInt(c, "relative_attention_max_distance", 128);
    sp.bias_every_layer = t == "umt5";
    if (sp.buckets < 4) return refuse("T5 relative_attention_num_buckets below 4");
  } else {
    if (f.norm != "layernorm") return refuse(t + " without LayerNorm");
    if (sp.gated) return refuse("gated feed-forward in a BART-family model is not built");
    if (ConfigBool(c, "use_prompt", false)) return refuse("MVP with prompts (use_prompt) is not built");
    sp.enc_heads = ConfigInt(c, "encoder_attention_heads", f.heads);
    sp.enc_ffn = ConfigInt(c, "encoder_ffn_dim", f.intermediate);
    if (f.hidden % sp.enc_heads != 0 || f.hidden % sp.dec_heads != 0) {
      return refuse("model width is not a multiple of the attention heads");
    }
    sp.enc_head_dim = f.hidden / sp.enc_heads;
    sp.dec_head_dim = f.hidden / sp.dec_heads;
    sp.context = f.context;
    if (sp.context <= 0) return refuse("position table without a context length (max_position_embeddings)");
    sp.pad = ConfigCount(c, "pad_token_id", 1);
    // The layout each class hard-codes.
    if (OneOf(t, {"bart", "plbart", "mvp"})) {
      sp.positions = "learned", sp.pos_offset = 2, sp.embed_norm = true, sp.logits_bias = true;
    } else if (t == "mbart") {
      sp.positions = "learned", sp.pos_offset = 2, sp.embed_norm = true, sp.pre_norm = sp.final_norm = true;
      sp.logits_bias = true;
    } else if (t == "marian") {
      sp.positions = "sinusoidal", sp.logits_bias = true;
      sp.separate_decoder_embed = !ConfigBool(c, "share_encoder_decoder_embeddings", true);
      if (sp.separate_decoder_embed) sp.dec_vocab = ConfigInt(c, "decoder_vocab_size", f.vocab);
    } else if (t == "pegasus") {
      sp.positions = "sinusoidal", sp.pre_norm = sp.final_norm = true, sp.logits_bias = true;
    } else if (t == "blenderbot") {
      sp.positions = "learned", sp.pre_norm = sp.final_norm = true, sp.logits_bias = true;
    } else if (t == "blenderbot-small") {
      sp.positions = "learned", sp.embed_norm = true, sp.logits_bias = true;
    } else {  // m2m_100
      sp.positions = "sinusoidal_ids", sp.pos_offset = 2, sp.pre_norm = sp.final_norm = true;
    }
    sp.embed_scale = ConfigBool(c, "scale_embedding", false) ? std::sqrt(static_cast<double>(f.hidden)) : 1.0;
  }
  return sp;
}

// Tokens each stack runs for a profile (see the top of the file).
struct Seq2SeqShape {
  bool decode = false;
  int64_t enc = 0;   // encoder tokens (run in prefill; cross-attention length in decode)
  int64_t dec = 0;   // decoder tokens this step
  int64_t past = 0;  // decoder self-attention cache
};

Seq2SeqShape ShapeOf(const Seq2SeqSpec& sp, const CaptureProfile& profile) {
  Seq2SeqShape s;
  const int64_t seq = std::max<int64_t>(1, profile.seq_len);
  const int64_t cap = sp.context > 0 ? sp.context : std::numeric_limits<int64_t>::max();
  // T5EncoderModel has no decoder step: a decode profile runs the encoder.
  s.decode = profile.past_len > 0 && sp.head != "encoder";
  if (s.decode) {
    s.dec = std::min(seq, cap);
    s.past = std::min(profile.past_len, cap - s.dec);
    s.enc = std::min(profile.past_len + 1, cap);
  } else {
    s.enc = std::min(seq, cap);
    s.dec = std::min<int64_t>({seq, 16, cap});
  }
  return s;
}

// The plan's layers count both stacks; each stack builds min(its layers,
// max_layers). Recovers the per-stack counts from the sum (it grows with
// max_layers until both stacks are whole, so the first match is the one).
std::pair<int64_t, int64_t> StackLayers(const Seq2SeqSpec& sp, int64_t layers_built) {
  const bool encoder_only = sp.head == "encoder";
  for (int64_t m = 1; m <= std::max(sp.enc_total, sp.dec_total); ++m) {
    const int64_t e = std::min(sp.enc_total, m), d = encoder_only ? 0 : std::min(sp.dec_total, m);
    if (e + d == layers_built) return {e, d};
  }
  return {sp.enc_total, encoder_only ? 0 : sp.dec_total};
}

struct Attention {
  Linear q, k, v, o;
};

struct Seq2SeqLayer {
  Attention self, cross;
  Norm ln_self, ln_cross, ln_ff;
  Linear fc1, fc_gate, fc2;  // T5: wi (or wi_0 gate, wi_1 up), wo
  at::Tensor rel_bias;       // T5: [buckets, heads]
  at::Tensor past_k, past_v, cross_k, cross_v;
};

}  // namespace

// ---------------------------------------------------------------------------

BuildPlan PlanEncoder(const selection::Features& f, const json& config, const CaptureProfile& profile,
                      const BuildOptions& options) {
  BuildPlan plan;
  plan.family = "encoder";
  if (f.structure != "encoder") {
    plan.reason = "the " + (f.structure.empty() ? std::string("unknown") : f.structure) +
                  " structure is not an encoder-only model";
    return plan;
  }
  const EncoderSpec sp = EncoderSpecOf(f, config);
  if (!sp.reason.empty()) {
    plan.reason = sp.reason;
    return plan;
  }
  plan.layers_total = f.layers;
  plan.layers_built = LayersBuilt(f.layers, options);
  const double eb = ElementBytes(profile.dtype);
  const double H = double(sp.hidden), I = double(sp.inter), E = double(sp.embedding), V = double(sp.vocab);
  const double inner = double(sp.heads * sp.head_dim);
  double per_layer = 4.0 * H * inner + 2.0 * H * I;
  if (sp.relative == "deberta" && !sp.share_att_key) per_layer += 2.0 * H * inner;
  if (sp.relative == "relative_key" || sp.relative == "relative_key_query") {
    per_layer += double(2 * sp.context - 1) * double(sp.head_dim);
  }
  const double distinct =
      sp.type == "albert" ? double(std::min(sp.groups, plan.layers_built)) : double(plan.layers_built);
  double embed = V * E + (sp.absolute ? double(sp.context) * E : 0.0) + double(sp.types) * E + (E != H ? E * H : 0.0);
  if (sp.relative == "deberta") embed += 2.0 * double(sp.span) * H;
  if (sp.conv_kernel > 0) embed += H * H / double(sp.conv_groups) * double(sp.conv_kernel);
  const double head = (sp.head == "mlm" || sp.head == "pretrain") ? H * H + (f.tied_embeddings ? 0.0 : V * E) : H * H;
  plan.weight_bytes = eb * (embed + per_layer * distinct + head);
  const double B = double(profile.batch), S = double(EncoderTokens(sp, profile));
  double scores = double(sp.heads) * S * S;
  if (sp.relative == "deberta") scores += 2.0 * double(sp.heads) * S * 2.0 * double(sp.span);
  const double logits = (sp.head == "mlm" || sp.head == "pretrain") ? B * S * V : 0.0;
  plan.activation_bytes = 4.0 * B * scores + eb * 8.0 * B * S * (H + I) + 4.0 * logits;
  // Matmuls dominate: 2 flops per weight per token, the attention scores and
  // their product with V (DeBERTa: its c2p / p2c products and the position
  // projections too), the head.
  const double layers = double(plan.layers_built), hd = double(sp.head_dim);
  double attention = 4.0 * B * double(sp.heads) * S * S * hd;
  if (sp.relative == "deberta") {
    const double rel = 2.0 * double(sp.span);
    attention += 2.0 * B * double(sp.heads) * S * rel * hd * double((sp.c2p ? 1 : 0) + (sp.p2c ? 1 : 0)) +
                 2.0 * rel * H * inner * 2.0;
  }
  const double head_weights = (sp.head == "mlm" || sp.head == "pretrain") ? H * H + V * E : H * H;
  plan.flops = (2.0 * B * S * (4.0 * H * inner + 2.0 * H * I) + attention) * layers + 2.0 * B * S * head_weights;
  if (plan.weight_bytes + plan.activation_bytes > options.max_bytes) {
    plan.reason = BudgetReason(plan.weight_bytes + plan.activation_bytes, plan.layers_built, plan.layers_total,
                               options.max_bytes);
    return plan;
  }
  if (profile.past_len > 0) plan.notes.push_back("encoder: the profile's past_len is ignored (no KV cache)");
  if (sp.max_tokens > 0 && std::max<int64_t>(1, profile.seq_len) > sp.max_tokens) {
    plan.notes.push_back("sequence capped at the position table: " + std::to_string(sp.max_tokens) + " tokens");
  }
  if (sp.type == "albert") plan.notes.push_back("ALBERT shares layer weights: the built layers reuse them");
  plan.buildable = true;
  return plan;
}

Status RunEncoder(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, ModelSession& rec,
                  uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  const EncoderSpec sp = EncoderSpecOf(f, plan.config);
  if (!sp.reason.empty()) return Status::InvalidArgument("model is not buildable: " + sp.reason);
  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const int64_t H = sp.hidden, E = sp.embedding, heads = sp.heads, hd = sp.head_dim, inner = heads * hd;
    const int64_t I = sp.inter, V = sp.vocab;
    const int64_t B = profile.batch, S = EncoderTokens(sp, profile);
    const bool deberta = sp.layout == EncoderLayout::kDeberta, distil = sp.layout == EncoderLayout::kDistilBert;
    const double eps = sp.eps;

    // Weights and inputs are made before recording starts.
    at::Tensor word = W({V, E});
    at::Tensor pos_table = sp.absolute ? W({sp.context, E}) : at::Tensor();
    at::Tensor type_table = sp.types > 0 ? W({sp.types, E}) : at::Tensor();
    at::Tensor task_table = sp.task_types > 0 ? W({sp.task_types, E}) : at::Tensor();
    Norm emb_ln = MakeLayerNorm(W, E);
    // E -> H: ALBERT's embedding_hidden_mapping_in, ELECTRA's
    // embeddings_project, DeBERTa's embed_proj (no bias).
    Linear emb_proj = E != H ? MakeLinear(W, H, E, /*bias=*/!deberta) : Linear{};
    at::Tensor rel_embeddings, mpnet_bias, conv_w, conv_b;
    Norm rel_ln, conv_ln;
    if (sp.relative == "deberta") {
      rel_embeddings = W({2 * sp.span, H});
      rel_ln = MakeLayerNorm(W, H);
    }
    if (sp.relative == "mpnet") mpnet_bias = W({std::max<int64_t>(sp.rel_buckets, 32), heads});
    if (sp.conv_kernel > 0) {
      conv_w = W({H, H / sp.conv_groups, sp.conv_kernel});
      conv_b = W({H});
      conv_ln = MakeLayerNorm(W, H);
    }
    const int64_t distinct = sp.type == "albert" ? std::min(sp.groups, plan.layers_built) : plan.layers_built;
    std::vector<EncoderLayer> layers(static_cast<size_t>(distinct));
    for (EncoderLayer& l : layers) {
      l.q = MakeLinear(W, inner, H), l.k = MakeLinear(W, inner, H), l.v = MakeLinear(W, inner, H);
      l.o = MakeLinear(W, H, inner);
      l.up = MakeLinear(W, I, H), l.down = MakeLinear(W, H, I);
      l.ln1 = MakeLayerNorm(W, H), l.ln2 = MakeLayerNorm(W, H);
      if (sp.relative == "deberta" && !sp.share_att_key) {
        if (sp.c2p) l.pos_k = MakeLinear(W, inner, H);
        if (sp.p2c) l.pos_q = MakeLinear(W, inner, H);
      }
      if (sp.relative == "relative_key" || sp.relative == "relative_key_query")
        l.distance = W({2 * sp.context - 1, hd});
    }
    Norm final_ln = MakeLayerNorm(W, H);
    Linear pooler = MakeLinear(W, H, H);
    // Heads.
    const int64_t mlm_width = (sp.mlm_style == "albert" || sp.mlm_style == "electra" || deberta) ? E : H;
    Linear mlm_dense = MakeLinear(W, mlm_width, H);
    Norm mlm_ln = MakeLayerNorm(W, mlm_width);
    Linear mlm_decoder{f.tied_embeddings ? word : W({V, mlm_width}), W({V})};
    Linear seq_dense = MakeLinear(W, deberta ? sp.pooler_hidden : H, H);
    Linear seq_out = MakeLinear(W, sp.labels, deberta ? sp.pooler_hidden : H);
    Linear pair = MakeLinear(W, 2, H);  // NSP / SOP / QA
    Linear disc_dense = MakeLinear(W, H, H), disc_pred = MakeLinear(W, 1, H);

    at::Tensor ids = at::randint(0, V, {B, S}, at::kLong);
    at::Tensor attention_mask = at::ones({B, S}, at::kLong);
    // Registered buffers of the embeddings (position_ids, token_type_ids).
    const int64_t buffer_len = std::max<int64_t>(S, sp.context);
    at::Tensor position_buffer = at::arange(0, buffer_len, at::kLong).unsqueeze(0);
    at::Tensor type_buffer = at::zeros({1, buffer_len}, at::kLong);

    c10::InferenceMode guard(!rec.training);
    rec.Start();
    at::Tensor x;
    {
      ModuleScope s(&rec, "embeddings");
      x = at::embedding(word, ids);
      if (sp.types > 0) x = x + at::embedding(type_table, type_buffer.slice(1, 0, S).expand({B, S}));
      if (sp.absolute) {
        at::Tensor position_ids = sp.pad >= 0 ? PositionIdsFromInputIds(ids, sp.pad) : position_buffer.slice(1, 0, S);
        x = x + at::embedding(pos_table, position_ids);
      }
      if (sp.task_types > 0) x = x + at::embedding(task_table, at::zeros({B, S}, at::kLong));
      if (deberta && E != H) x = emb_proj(x);
      if (sp.embed_norm) x = LayerNorm(x, emb_ln, eps);
      if (deberta) x = x * attention_mask.unsqueeze(2).to(dt);
    }
    if (E != H && !deberta) {
      ModuleScope s(&rec, sp.type == "albert" ? "encoder.embedding_hidden_mapping_in" : "embeddings_project");
      x = emb_proj(x);
    }
    // Masks, once per forward.
    at::Tensor mask;
    {
      ModuleScope s(&rec, "get_extended_attention_mask");
      if (distil) {
        mask = (attention_mask == 0).view({B, 1, 1, S});
      } else if (deberta) {
        at::Tensor m = attention_mask.unsqueeze(1).unsqueeze(2);
        mask = (m * m.squeeze(-2).unsqueeze(-1)).to(at::kBool).logical_not();  // true where masked
      } else {
        mask = ExtendedMask(attention_mask, dt);
      }
    }
    at::Tensor relative_pos, rel_emb, position_bias;
    if (sp.relative == "deberta") {
      ModuleScope s(&rec, "encoder.rel_embeddings");
      relative_pos = BuildRelativePosition(S, S, sp.buckets, sp.max_relative);
      rel_emb = sp.norm_rel ? LayerNorm(rel_embeddings, rel_ln, eps) : rel_embeddings;
    }
    if (sp.relative == "mpnet") {
      ModuleScope s(&rec, "encoder.relative_attention_bias");
      position_bias =
          RelativeBias(mpnet_bias, S, 0, S, /*bidirectional=*/true, 32, 128).expand({B, heads, S, S}).contiguous();
    }
    const double scaling = 1.0 / std::sqrt(static_cast<double>(hd));
    const int64_t total = plan.layers_total;
    for (int64_t li = 0; li < plan.layers_built; ++li) {
      // ALBERT: layer i runs group i * groups / layers.
      const int64_t group = sp.type == "albert" ? li * sp.groups / total : li;
      const EncoderLayer& l = layers[static_cast<size_t>(group)];
      const std::string path = sp.type == "albert"
                                   ? "encoder.albert_layer_groups." + std::to_string(group) + ".albert_layers.0"
                               : distil ? "transformer.layer." + std::to_string(li)
                                        : "encoder.layer." + std::to_string(li);
      const at::Tensor layer_input = x;
      at::Tensor h = x;
      if (sp.pre_norm) {
        ModuleScope s(&rec, path + ".attention.LayerNorm");
        h = LayerNorm(x, l.ln1, eps);
      }
      at::Tensor context;
      {
        ModuleScope s(&rec, path + (distil ? ".attention" : ".attention.self"));
        if (deberta) {
          // Note: transformers' DisentangledSelfAttention works on [B * heads, S, d].
          auto split = [&](const at::Tensor& t) {
            return t.view({t.size(0), t.size(1), heads, -1})
                .permute({0, 2, 1, 3})
                .contiguous()
                .view({-1, t.size(1), hd});
          };
          at::Tensor q = split(l.q(h)), k = split(l.k(h)), v = split(l.v(h));
          const int64_t factor = 1 + (sp.c2p ? 1 : 0) + (sp.p2c ? 1 : 0);
          at::Tensor scale =
              at::sqrt(at::scalar_tensor(static_cast<double>(hd), at::kFloat) * static_cast<double>(factor));
          at::Tensor scores = at::bmm(q, k.transpose(-1, -2) / scale.to(dt));
          if (sp.relative == "deberta" && (sp.c2p || sp.p2c)) {
            at::Tensor rel = relative_pos.unsqueeze(1);  // [1, 1, S, S]
            at::Tensor emb = rel_emb.slice(0, 0, 2 * sp.span).unsqueeze(0);
            at::Tensor pos_key, pos_query;
            if (sp.share_att_key) {
              pos_query = split(l.q(emb)).repeat({B, 1, 1});
              pos_key = split(l.k(emb)).repeat({B, 1, 1});
            } else {
              if (sp.c2p) pos_key = split(l.pos_k(emb)).repeat({B, 1, 1});
              if (sp.p2c) pos_query = split(l.pos_q(emb)).repeat({B, 1, 1});
            }
            at::Tensor rel_scale =
                at::sqrt(at::scalar_tensor(static_cast<double>(hd), at::kFloat) * static_cast<double>(factor));
            if (sp.c2p) {
              at::Tensor c2p = at::bmm(q, pos_key.transpose(-1, -2));
              at::Tensor c2p_pos = at::clamp(rel + sp.span, 0, 2 * sp.span - 1);
              c2p = at::gather(c2p, -1, c2p_pos.squeeze(0).expand({q.size(0), q.size(1), rel.size(-1)}));
              scores = scores + c2p / rel_scale.to(c2p.scalar_type());
            }
            if (sp.p2c) {
              at::Tensor p2c_pos = at::clamp(-rel + sp.span, 0, 2 * sp.span - 1);
              at::Tensor p2c = at::bmm(k, pos_query.transpose(-1, -2));
              p2c =
                  at::gather(p2c, -1, p2c_pos.squeeze(0).expand({q.size(0), k.size(-2), k.size(-2)})).transpose(-1, -2);
              scores = scores + p2c / rel_scale.to(p2c.scalar_type());
            }
          }
          scores = scores.view({-1, heads, S, S}).masked_fill(mask, Lowest(dt));
          at::Tensor probs = at::softmax(scores, -1);
          context = at::bmm(probs.view({-1, S, S}), v)
                        .view({-1, heads, S, hd})
                        .permute({0, 2, 1, 3})
                        .contiguous()
                        .view({B, S, inner});
        } else if (distil) {
          at::Tensor q = SplitHeads(l.q(h), heads) / std::sqrt(static_cast<double>(hd));
          at::Tensor k = SplitHeads(l.k(h), heads), v = SplitHeads(l.v(h), heads);
          at::Tensor scores = at::matmul(q, k.transpose(2, 3));
          scores = scores.masked_fill(mask.expand_as(scores), at::scalar_tensor(Lowest(dt), scores.options()));
          context = MergeHeads(at::matmul(at::softmax(scores, -1), v));
        } else {
          at::Tensor q = SplitHeads(l.q(h), heads), k = SplitHeads(l.k(h), heads), v = SplitHeads(l.v(h), heads);
          at::Tensor scores = at::matmul(q, k.transpose(-1, -2));
          if (l.distance.defined()) {
            // BERT adds the distance scores before scaling.
            at::Tensor left = at::arange(0, S, at::kLong).view({-1, 1});
            at::Tensor right = at::arange(0, S, at::kLong).view({1, -1});
            at::Tensor pe = at::embedding(l.distance, left - right + (sp.context - 1)).to(dt);
            scores = scores + at::einsum("bhld,lrd->bhlr", {q, pe});
            if (sp.relative == "relative_key_query") scores = scores + at::einsum("bhrd,lrd->bhlr", {k, pe});
          }
          scores = scores * scaling;
          if (position_bias.defined()) scores = scores + position_bias;
          scores = scores + mask;
          context = MergeHeads(at::matmul(at::softmax(scores, -1), v));
        }
      }
      at::Tensor attn_out;
      {
        ModuleScope s(&rec, path + (distil ? ".sa_layer_norm" : ".attention.output"));
        attn_out = l.o(context);
        attn_out = sp.pre_norm ? x + attn_out : LayerNorm(attn_out + h, l.ln1, eps);
      }
      at::Tensor ff_in = attn_out;
      if (sp.pre_norm) {
        ModuleScope s(&rec, path + ".LayerNorm");
        ff_in = LayerNorm(attn_out, l.ln2, eps);
      }
      at::Tensor up;
      {
        ModuleScope s(&rec, path + (distil ? ".ffn" : ".intermediate"));
        up = Act(l.up(ff_in), sp.act);
      }
      {
        ModuleScope s(&rec, path + (distil ? ".output_layer_norm" : ".output"));
        at::Tensor down = l.down(up);
        x = sp.pre_norm ? attn_out + down : LayerNorm(down + attn_out, l.ln2, eps);
      }
      if (li == 0 && sp.conv_kernel > 0) {
        // DeBERTa's ConvLayer: a convolution of the layer's input, added to
        // its output.
        ModuleScope s(&rec, "encoder.conv");
        at::Tensor out = at::conv1d(layer_input.permute({0, 2, 1}).contiguous(), conv_w, conv_b, 1,
                                    (sp.conv_kernel - 1) / 2, 1, sp.conv_groups)
                             .permute({0, 2, 1})
                             .contiguous();
        at::Tensor rmask = at::rsub(attention_mask, 1).to(at::kBool);
        out.masked_fill_(rmask.unsqueeze(-1).expand(out.sizes()), 0);
        out = Act(out, sp.conv_act);
        at::Tensor normed = LayerNorm(x + out, conv_ln, eps);
        x = normed * attention_mask.unsqueeze(2).to(normed.scalar_type());
      }
    }
    if (sp.pre_norm) {
      ModuleScope s(&rec, "encoder.LayerNorm");
      x = LayerNorm(x, final_ln, eps);
    }
    at::Tensor pooled;
    if (sp.pooler) {
      ModuleScope s(&rec, "pooler");
      pooled = at::tanh(pooler(x.select(1, 0)));
    }
    auto masked_lm = [&]() {
      ModuleScope s(&rec, sp.mlm_style == "roberta"      ? "lm_head"
                          : sp.mlm_style == "electra"    ? "generator_predictions"
                          : sp.mlm_style == "distilbert" ? "vocab_transform"
                                                         : "cls.predictions");
      // BERT's transform uses hidden_act; RoBERTa's and ELECTRA's
      // generator use exact GELU; DistilBERT its `activation`.
      const std::string act = sp.mlm_style == "roberta" || sp.mlm_style == "electra" ? "gelu" : sp.act;
      at::Tensor t = LayerNorm(Act(mlm_dense(x), act), mlm_ln, eps);
      return mlm_decoder(t);
    };
    if (sp.head == "mlm") {
      masked_lm();
    } else if (sp.head == "pretrain") {
      if (sp.type == "electra") {
        ModuleScope s(&rec, "discriminator_predictions");
        disc_pred(Act(disc_dense(x), sp.act)).squeeze(-1);
      } else {
        masked_lm();
        ModuleScope s(&rec, sp.type == "albert" ? "sop_classifier" : "cls.seq_relationship");
        pair(pooled);
      }
    } else if (sp.head == "seq") {
      ModuleScope s(&rec, "classifier");
      if (sp.seq_style == "pooler") {
        seq_out(pooled);
      } else if (sp.seq_style == "distilbert") {
        seq_out(at::relu(seq_dense(x.select(1, 0))));
      } else if (sp.seq_style == "context_pooler") {
        seq_out(Act(seq_dense(x.select(1, 0)), sp.pooler_act));
      } else {
        at::Tensor first = x.select(1, 0);
        seq_out(sp.seq_style == "gelu_head" ? at::gelu(seq_dense(first)) : at::tanh(seq_dense(first)));
      }
    } else if (sp.head == "token") {
      ModuleScope s(&rec, "classifier");
      seq_out(x);
    } else if (sp.head == "qa") {
      ModuleScope s(&rec, "qa_outputs");
      std::vector<at::Tensor> parts = pair(x).split(1, -1);
      parts[0].squeeze(-1).contiguous();
      parts[1].squeeze(-1).contiguous();
    }
    rec.Stop();
    return Status::Ok();
  } catch (const std::exception& e) {
    rec.Stop();
    return Status::Internal(std::string("building or running the model failed: ") + e.what());
  }
}

// ---------------------------------------------------------------------------

BuildPlan PlanEncoderDecoder(const selection::Features& f, const json& config, const CaptureProfile& profile,
                             const BuildOptions& options) {
  BuildPlan plan;
  plan.family = "encoder-decoder";
  if (f.structure != "encoder-decoder") {
    plan.reason = "the " + (f.structure.empty() ? std::string("unknown") : f.structure) +
                  " structure is not an encoder-decoder model";
    return plan;
  }
  const Seq2SeqSpec sp = Seq2SeqSpecOf(f, config);
  if (!sp.reason.empty()) {
    plan.reason = sp.reason;
    return plan;
  }
  const int64_t enc_built = LayersBuilt(sp.enc_total, options), dec_built = LayersBuilt(sp.dec_total, options);
  const bool encoder_only = sp.head == "encoder";
  plan.layers_total = sp.enc_total + (encoder_only ? 0 : sp.dec_total);
  plan.layers_built = enc_built + (encoder_only ? 0 : dec_built);
  const Seq2SeqShape shape = ShapeOf(sp, profile);
  const double eb = ElementBytes(profile.dtype);
  const double H = double(sp.hidden), V = double(sp.vocab);
  const double enc_inner = double(sp.enc_heads * sp.enc_head_dim), dec_inner = double(sp.dec_heads * sp.dec_head_dim);
  const double mlp = sp.gated ? 3.0 : 2.0;
  const double enc_layer = 4.0 * H * enc_inner + mlp * H * double(sp.enc_ffn);
  const double dec_layer = 8.0 * H * dec_inner + mlp * H * double(sp.dec_ffn);
  double embed = V * H;
  if (sp.separate_decoder_embed) embed += double(sp.dec_vocab) * H;
  if (!f.tied_embeddings && sp.head == "lm") embed += double(sp.dec_vocab) * H;
  if (!sp.t5) embed += 2.0 * double(sp.context + sp.pos_offset) * H;
  plan.weight_bytes =
      eb * (embed + enc_layer * double(enc_built) + (encoder_only ? 0.0 : dec_layer * double(dec_built)));
  const double B = double(profile.batch), Se = double(shape.enc), Sd = double(shape.dec);
  const double T = double(shape.past + shape.dec);
  const double I = double(std::max(sp.enc_ffn, sp.dec_ffn));
  const double caches = 2.0 * B * dec_inner * (double(shape.past) + Se) * double(dec_built);
  plan.activation_bytes = 4.0 * B * (double(sp.enc_heads) * Se * Se + double(sp.dec_heads) * Sd * (T + Se)) +
                          eb * (caches + 6.0 * B * (Se + Sd) * (H + I)) +
                          (sp.head == "lm" ? 4.0 * B * Sd * double(sp.dec_vocab) : 0.0);
  // Matmuls dominate: 2 flops per weight per token, the attention scores and
  // their product with V. In decode the encoder does not run and the cross
  // K/V are cached; in prefill the decoder projects the encoder output.
  const double enc_flops = 2.0 * B * Se * enc_layer + 4.0 * B * Se * Se * enc_inner;
  const double cross_kv = shape.decode ? 0.0 : 2.0 * B * Se * 2.0 * H * dec_inner;
  const double dec_flops =
      2.0 * B * Sd * (dec_layer - 2.0 * H * dec_inner) + cross_kv + 4.0 * B * Sd * (T + Se) * dec_inner;
  plan.flops = (shape.decode ? 0.0 : enc_flops * double(enc_built)) +
               (encoder_only ? 0.0
                             : dec_flops * double(dec_built) +
                                   (sp.head == "lm" ? 2.0 * B * Sd * H * double(sp.dec_vocab) : 0.0));
  if (plan.weight_bytes + plan.activation_bytes > options.max_bytes) {
    plan.reason = BudgetReason(plan.weight_bytes + plan.activation_bytes, plan.layers_built, plan.layers_total,
                               options.max_bytes);
    return plan;
  }
  if (encoder_only) {
    plan.notes.push_back("T5EncoderModel: the encoder stack only");
  } else if (shape.decode) {
    plan.notes.push_back("decode: one decoder step of " + std::to_string(shape.dec) + " token(s) over a cache of " +
                         std::to_string(shape.past) + "; cross-attention K/V precomputed from an encoder output of " +
                         std::to_string(shape.enc) + " tokens; the encoder does not run");
  } else {
    plan.notes.push_back("prefill: encoder over " + std::to_string(shape.enc) +
                         " tokens, decoder teacher-forced over " + std::to_string(shape.dec) + " tokens");
  }
  plan.notes.push_back(std::to_string(enc_built) + " of " + std::to_string(sp.enc_total) + " encoder and " +
                       std::to_string(encoder_only ? 0 : dec_built) + " of " + std::to_string(sp.dec_total) +
                       " decoder layers built");
  plan.buildable = true;
  return plan;
}

Status RunEncoderDecoder(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile,
                         ModelSession& rec, uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  const Seq2SeqSpec sp = Seq2SeqSpecOf(f, plan.config);
  if (!sp.reason.empty()) return Status::InvalidArgument("model is not buildable: " + sp.reason);
  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const Seq2SeqShape shape = ShapeOf(sp, profile);
    const int64_t H = sp.hidden, dec_hd = sp.dec_head_dim, B = profile.batch;
    const int64_t Se = shape.enc, Sd = shape.dec, P = shape.past, T = P + Sd;
    const int64_t enc_inner = sp.enc_heads * sp.enc_head_dim, dec_inner = sp.dec_heads * dec_hd;
    const bool t5 = sp.t5, bias = !t5, encoder_only = sp.head == "encoder";
    const auto [n_enc, n_dec] = StackLayers(sp, plan.layers_built);
    const double eps = sp.eps;
    auto norm = [&](int64_t n) { return t5 ? Norm{W.Ones({n}), at::Tensor()} : MakeLayerNorm(W, n); };
    auto apply_norm = [&](const at::Tensor& x, const Norm& n) { return ApplyNorm(x, n, /*rms=*/t5, eps); };
    auto attention = [&](int64_t inner, int64_t kv_in) {
      return Attention{MakeLinear(W, inner, H, bias), MakeLinear(W, inner, kv_in, bias),
                       MakeLinear(W, inner, kv_in, bias), MakeLinear(W, H, inner, bias)};
    };
    auto ff = [&](Seq2SeqLayer& l, int64_t n) {
      l.fc1 = MakeLinear(W, n, H, bias);
      if (sp.gated) l.fc_gate = MakeLinear(W, n, H, bias);
      l.fc2 = MakeLinear(W, H, n, bias);
    };

    // Weights and inputs are made before recording starts.
    at::Tensor shared = W({sp.vocab, H});
    at::Tensor dec_embed = sp.separate_decoder_embed ? W({sp.dec_vocab, H}) : shared;
    at::Tensor lm_head = f.tied_embeddings ? dec_embed : W({sp.dec_vocab, H});
    at::Tensor logits_bias = sp.logits_bias ? W.Zeros({1, sp.dec_vocab}) : at::Tensor();
    // M2M-100's positions count from the padding index.
    const int64_t table_rows =
        sp.context + sp.pos_offset + (sp.positions == "sinusoidal_ids" ? std::max<int64_t>(0, sp.pad) : 0);
    at::Tensor enc_pos, dec_pos;
    if (sp.positions == "learned") {
      enc_pos = W({table_rows, H});
      dec_pos = W({table_rows, H});
    } else if (!sp.positions.empty()) {
      enc_pos = dec_pos = SinusoidalTable(table_rows, H, dt);
    }
    Norm enc_emb_ln = norm(H), dec_emb_ln = norm(H), enc_final = norm(H), dec_final = norm(H);
    std::vector<Seq2SeqLayer> enc(static_cast<size_t>(shape.decode ? 0 : n_enc));
    for (size_t i = 0; i < enc.size(); ++i) {
      Seq2SeqLayer& l = enc[i];
      l.self = attention(enc_inner, H);
      l.ln_self = norm(H), l.ln_ff = norm(H);
      ff(l, sp.enc_ffn);
      if (t5 && (i == 0 || sp.bias_every_layer)) l.rel_bias = W({sp.buckets, sp.enc_heads});
    }
    // Decode: the encoder's output exists already; cross K/V are cached.
    at::Tensor enc_out_given = shape.decode ? W({B, Se, H}) : at::Tensor();
    std::vector<Seq2SeqLayer> dec(static_cast<size_t>(n_dec));
    for (size_t i = 0; i < dec.size(); ++i) {
      Seq2SeqLayer& l = dec[i];
      l.self = attention(dec_inner, H);
      l.cross = attention(dec_inner, H);
      l.ln_self = norm(H), l.ln_cross = norm(H), l.ln_ff = norm(H);
      ff(l, sp.dec_ffn);
      if (t5 && (i == 0 || sp.bias_every_layer)) l.rel_bias = W({sp.buckets, sp.dec_heads});
      if (P > 0) l.past_k = W({B, sp.dec_heads, P, dec_hd}), l.past_v = W({B, sp.dec_heads, P, dec_hd});
      if (shape.decode) {
        l.cross_k = SplitHeads(l.cross.k(enc_out_given), sp.dec_heads).contiguous();
        l.cross_v = SplitHeads(l.cross.v(enc_out_given), sp.dec_heads).contiguous();
      }
    }
    at::Tensor enc_ids = at::randint(0, sp.vocab, {B, Se}, at::kLong);
    at::Tensor dec_ids = at::randint(0, sp.dec_vocab, {B, Sd}, at::kLong);
    at::Tensor enc_mask = at::ones({B, Se}, at::kLong);
    const bool fp16 = dt == at::kHalf;

    c10::InferenceMode guard(!rec.training);
    rec.Start();

    // T5's clamp of fp16 activations after each sublayer.
    auto clamp_fp16 = [&](const at::Tensor& x) {
      if (!fp16) return x;
      const double max = 65504.0;
      at::Tensor clamp_value = at::where(at::isinf(x).any(), at::scalar_tensor(max - 1000.0, x.options()),
                                         at::scalar_tensor(max, x.options()));
      return at::clamp(x, -clamp_value, clamp_value);
    };
    // Attention of `h` over `kv_src` (or the given K/V), with additive `extra`
    // (mask and/or position bias); T5 scores are unscaled and softmaxed in fp32.
    auto attend = [&](const Attention& a, int64_t heads, const at::Tensor& h, const at::Tensor& kv_src,
                      const at::Tensor& past_k, const at::Tensor& past_v, const at::Tensor& given_k,
                      const at::Tensor& given_v, const at::Tensor& extra) {
      at::Tensor q = SplitHeads(a.q(h), heads);
      at::Tensor k = given_k.defined() ? given_k : SplitHeads(a.k(kv_src), heads);
      at::Tensor v = given_v.defined() ? given_v : SplitHeads(a.v(kv_src), heads);
      if (past_k.defined()) {
        k = at::cat({past_k, k}, 2);
        v = at::cat({past_v, v}, 2);
      }
      at::Tensor scores = at::matmul(q, k.transpose(2, 3));
      if (!t5) scores = scores * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
      if (extra.defined()) scores = scores + extra;
      at::Tensor probs = t5 ? at::softmax(scores.to(at::kFloat), -1).type_as(scores) : at::softmax(scores, -1);
      return a.o(MergeHeads(at::matmul(probs, v)));
    };
    // The BART family's fc1 (and activation) has its own module; T5's
    // DenseReluDense is one.
    auto feed_forward = [&](const Seq2SeqLayer& l, const at::Tensor& h, const std::string& fc1_path) {
      if (t5) return l.fc2(sp.gated ? Act(l.fc_gate(h), sp.act) * l.fc1(h) : Act(l.fc1(h), sp.act));
      at::Tensor up;
      {
        ModuleScope s(&rec, fc1_path);
        up = Act(l.fc1(h), sp.act);
      }
      return l.fc2(up);
    };
    // One residual sublayer. T5: norm, body, residual add, the fp16 clamp.
    // BART family: the norm before the body (pre-norm) or after the residual
    // add (post-norm).
    auto sublayer = [&](const at::Tensor& x, const Norm& n, const std::string& norm_path, const std::string& body_path,
                        const auto& body) {
      at::Tensor h = x;
      if (t5 || sp.pre_norm) {
        ModuleScope s(&rec, norm_path);
        h = apply_norm(x, n);
      }
      at::Tensor out;
      {
        ModuleScope s(&rec, body_path);
        out = x + body(h);
        if (t5) out = clamp_fp16(out);
      }
      if (!t5 && !sp.pre_norm) {
        ModuleScope s(&rec, norm_path);
        out = apply_norm(out, n);
      }
      return out;
    };
    auto embed_positions = [&](const at::Tensor& table, const at::Tensor& ids, int64_t past) {
      const int64_t n = ids.size(1);
      if (sp.positions == "sinusoidal_ids") {
        at::Tensor position_ids = PositionIdsFromInputIds(ids, sp.pad, past);
        return table.index_select(0, position_ids.view({-1})).view({ids.size(0), n, H});
      }
      at::Tensor positions = at::arange(past, past + n, at::kLong).expand({ids.size(0), -1});
      if (sp.pos_offset > 0) positions = positions + sp.pos_offset;
      return at::embedding(table, positions);
    };
    // Token embeddings, then (BART family) positions and layernorm_embedding.
    auto embed = [&](const std::string& stack, const at::Tensor& table, const at::Tensor& pos_table,
                     const Norm& emb_norm, const at::Tensor& ids, int64_t past) {
      at::Tensor x;
      {
        ModuleScope s(&rec, stack + ".embed_tokens");
        x = at::embedding(table, ids);
        if (sp.embed_scale != 1.0) x = x * sp.embed_scale;
      }
      if (t5) return x;
      {
        ModuleScope s(&rec, stack + ".embed_positions");
        x = x + embed_positions(pos_table, ids, past);
      }
      if (sp.embed_norm) {
        ModuleScope s(&rec, stack + ".layernorm_embedding");
        x = apply_norm(x, emb_norm);
      }
      return x;
    };

    at::Tensor enc_out = enc_out_given;
    if (!shape.decode) {
      at::Tensor x = embed("encoder", shared, enc_pos, enc_emb_ln, enc_ids, 0);
      at::Tensor mask, position_bias;
      {
        ModuleScope s(&rec, "encoder");
        mask = t5 ? ExtendedMask(enc_mask, dt) : Expanded4dMask(enc_mask, Se, dt);
      }
      for (size_t li = 0; li < enc.size(); ++li) {
        const Seq2SeqLayer& l = enc[li];
        const std::string path = (t5 ? "encoder.block." : "encoder.layers.") + std::to_string(li);
        x = sublayer(x, l.ln_self, path + (t5 ? ".layer.0.layer_norm" : ".self_attn_layer_norm"),
                     path + (t5 ? ".layer.0.SelfAttention" : ".self_attn"), [&](const at::Tensor& h) {
                       if (!t5) return attend(l.self, sp.enc_heads, h, h, {}, {}, {}, {}, mask);
                       if (l.rel_bias.defined()) {
                         position_bias =
                             RelativeBias(l.rel_bias, Se, 0, Se, /*bidirectional=*/true, sp.buckets, sp.max_distance) +
                             mask;
                       }
                       return attend(l.self, sp.enc_heads, h, h, {}, {}, {}, {}, position_bias);
                     });
        x = sublayer(x, l.ln_ff, path + (t5 ? ".layer.1.layer_norm" : ".final_layer_norm"),
                     path + (t5 ? ".layer.1.DenseReluDense" : ".fc2"),
                     [&](const at::Tensor& h) { return feed_forward(l, h, path + ".fc1"); });
        // BART-family encoder layers clamp fp16 activations.
        if (fp16 && !t5) x = at::clamp(x, -(65504.0 - 1000.0), 65504.0 - 1000.0);
      }
      if (t5 || sp.final_norm) {
        ModuleScope s(&rec, t5 ? "encoder.final_layer_norm" : "encoder.layer_norm");
        x = apply_norm(x, enc_final);
      }
      enc_out = x;
    }

    if (!encoder_only) {
      at::Tensor x = embed("decoder", dec_embed, dec_pos, dec_emb_ln, dec_ids, P);
      at::Tensor causal, cross_mask, self_bias, cross_bias;
      {
        ModuleScope s(&rec, "decoder");
        if (Sd > 1) causal = CausalMask(Sd, P, dt);
        cross_mask = t5 ? ExtendedMask(enc_mask, dt) : Expanded4dMask(enc_mask, Sd, dt);
      }
      for (size_t li = 0; li < dec.size(); ++li) {
        const Seq2SeqLayer& l = dec[li];
        const std::string path = (t5 ? "decoder.block." : "decoder.layers.") + std::to_string(li);
        x = sublayer(x, l.ln_self, path + (t5 ? ".layer.0.layer_norm" : ".self_attn_layer_norm"),
                     path + (t5 ? ".layer.0.SelfAttention" : ".self_attn"), [&](const at::Tensor& h) {
                       if (!t5) return attend(l.self, sp.dec_heads, h, h, l.past_k, l.past_v, {}, {}, causal);
                       if (l.rel_bias.defined()) {
                         self_bias =
                             RelativeBias(l.rel_bias, Sd, P, T, /*bidirectional=*/false, sp.buckets, sp.max_distance);
                         if (causal.defined()) self_bias = self_bias + causal;
                       }
                       return attend(l.self, sp.dec_heads, h, h, l.past_k, l.past_v, {}, {}, self_bias);
                     });
        x = sublayer(x, l.ln_cross, path + (t5 ? ".layer.1.layer_norm" : ".encoder_attn_layer_norm"),
                     path + (t5 ? ".layer.1.EncDecAttention" : ".encoder_attn"), [&](const at::Tensor& h) {
                       if (!t5)
                         return attend(l.cross, sp.dec_heads, h, enc_out, {}, {}, l.cross_k, l.cross_v, cross_mask);
                       if (li == 0 || sp.bias_every_layer) {
                         // T5's cross-attention has no relative bias: zeros plus the mask.
                         cross_bias = at::zeros({1, sp.dec_heads, Sd, Se}, at::TensorOptions().dtype(dt)) + cross_mask;
                       }
                       return attend(l.cross, sp.dec_heads, h, enc_out, {}, {}, l.cross_k, l.cross_v, cross_bias);
                     });
        x = sublayer(x, l.ln_ff, path + (t5 ? ".layer.2.layer_norm" : ".final_layer_norm"),
                     path + (t5 ? ".layer.2.DenseReluDense" : ".fc2"),
                     [&](const at::Tensor& h) { return feed_forward(l, h, path + ".fc1"); });
      }
      if (t5 || sp.final_norm) {
        ModuleScope s(&rec, t5 ? "decoder.final_layer_norm" : "decoder.layer_norm");
        x = apply_norm(x, dec_final);
      }
      if (sp.head == "lm") {
        ModuleScope s(&rec, "lm_head");
        // T5 rescales before a tied LM head.
        if (t5 && f.tied_embeddings) x = x * std::pow(static_cast<double>(H), -0.5);
        at::Tensor logits = at::linear(x, lm_head);
        if (logits_bias.defined()) logits = logits + logits_bias;
      }
    }
    rec.Stop();
    return Status::Ok();
  } catch (const std::exception& e) {
    rec.Stop();
    return Status::Internal(std::string("building or running the model failed: ") + e.what());
  }
}

}  // namespace coverage::runners::builder
