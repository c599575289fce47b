// Signatures: which models are "the same" for a backend.
//
// Note [Signatures]
// Two models with the same COARSE signature run the same kinds of kernels:
// same family (model_type, or the architecture class when a config has
// none) and task head, same structure, attention kind, position
// scheme (and rope scaling type), norm kind and placement, activation and
// gating, dense or MoE (with or without shared experts), tied embeddings,
// sliding window or not, quantization method, and which towers (vision,
// audio) they carry. The dimensions can differ.
//
// Two models with the same FINE signature are, in addition, in the same
// size class: every dimension is bucketed by its bit width, b(x) = floor(log2
// x) + 1 and b(0) = 0 (so 4096, 5120 and 8191 share bucket 13; 8192 is in
// 14), and the dtype matches. Bucketed dims: hidden, layers, encoder_layers, heads, kv_heads,
// head_dim, intermediate, vocab, context, experts, experts_per_token,
// sliding_window, image_size, patch_size, the towers' hidden and layers.
//
// Both are printable strings (fields joined by '|', stable across versions
// of this code only while kFeatureExtractorVersion is unchanged) and have a
// 64-bit hash for compact keys.
#pragma once

#include <cstdint>
#include <string>

#include "selection/features.h"

namespace coverage::selection {

// floor(log2(x)) + 1 for x >= 1; 0 for x <= 0.
int Bucket(int64_t x);

std::string CoarseSignature(const Features& f);
std::string FineSignature(const Features& f);

// FNV-1a of the signature text: a stable 64-bit key.
uint64_t SignatureHash(const std::string& signature);

}  // namespace coverage::selection
