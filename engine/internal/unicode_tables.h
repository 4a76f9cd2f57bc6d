// Unicode data for the tokenizer (internal to engine/), generated into engine/unicode_tables.cc by
// scripts/gen_unicode_tables.js. Every table is sorted by its first field.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hr::engine::internal {

struct CodePointRange {
  uint32_t first, last;  // inclusive
};
// Canonical combining classes as an order: `order` is larger exactly where the class is, and is
// 0 only for class 0 (code points in no range).
struct CombiningRange {
  uint32_t first, last;
  uint8_t order;
};
struct Decomposition {
  uint32_t code_point;
  uint16_t offset;  // into kDecompositionParts
  uint8_t length;
};
struct Composition {
  uint32_t first, second, composite;
};

extern const CodePointRange kLetterRanges[];  // \p{L}
extern const size_t kNumLetterRanges;
extern const CodePointRange kNumberRanges[];  // \p{N}
extern const size_t kNumNumberRanges;
extern const CodePointRange kWordRanges[];  // \w of Rust's regex crate
extern const size_t kNumWordRanges;
extern const CombiningRange kCombiningRanges[];
extern const size_t kNumCombiningRanges;
extern const Decomposition kDecompositions[];  // full canonical decompositions, Hangul aside
extern const size_t kNumDecompositions;
extern const uint32_t kDecompositionParts[];
extern const Composition kCompositions[];  // primary composites, Hangul aside
extern const size_t kNumCompositions;

}  // namespace hr::engine::internal
