#!/usr/bin/env node
// Writes engine/unicode_tables.cc: the Unicode data the tokenizer needs, taken from node's own
// Unicode support (its \p{...} regexes and String.prototype.normalize), so that it matches the
// JavaScript tokenizers the cross-check test compares against. Usage:
//   node scripts/gen_unicode_tables.js > engine/unicode_tables.cc
// Tables: letters (\p{L}), numbers (\p{N}) and word characters (\w as Rust's regex crate has it,
// which Hugging Face tokenizers use for added tokens' single_word) as code point ranges; for NFC,
// the full canonical decomposition of each decomposable code point, the primary composites by their
// two parts, and the combining classes. node does not expose Canonical_Combining_Class itself, so
// the table holds its order instead: a rank that keeps which of two classes is larger and whether
// they are equal, read off from how NFD reorders pairs of marks. That is all canonical ordering and
// composition use.
// Before writing, the script runs NFC built from these tables against node's over every code point
// and many random mark sequences, and exits non-zero on any difference.
'use strict';

const MAX = 0x10ffff;
const isSurrogate = (c) => c >= 0xd800 && c <= 0xdfff;
const str = (...cps) => String.fromCodePoint(...cps);
const cps = (s) => Array.from(s, (ch) => ch.codePointAt(0));
const S_BASE = 0xac00, S_COUNT = 11172;
const isHangulSyllable = (c) => c >= S_BASE && c < S_BASE + S_COUNT;

function ranges(re) {
  const out = [];
  for (let c = 0; c <= MAX; ++c) {
    if (isSurrogate(c) || !re.test(str(c))) continue;
    if (out.length && out[out.length - 1][1] === c - 1) out[out.length - 1][1] = c;
    else out.push([c, c]);
  }
  return out;
}

// Full canonical decompositions (Hangul syllables are done by arithmetic, not stored).
const decomp = new Map();
for (let c = 0; c <= MAX; ++c) {
  if (isSurrogate(c) || isHangulSyllable(c)) continue;
  const d = str(c).normalize('NFD');
  if (d !== str(c)) decomp.set(c, cps(d));
}

// Non-zero combining classes: a mark x (not decomposable) is reordered before U+0345 (class 240,
// the largest) unless its class is 0 or 240, and after U+0334 (class 1, the smallest) unless its
// class is 0 or 1.
const HI = 0x345, LO = 0x334;
const swaps = (a, b) => str(a, b).normalize('NFD') === str(b, a);
const marks = [];
for (let c = 0; c <= MAX; ++c) {
  if (isSurrogate(c) || decomp.has(c) || isHangulSyllable(c)) continue;
  if (c === HI || c === LO || swaps(HI, c) || swaps(c, LO)) marks.push(c);
}
// Sort by class: a before b when b + a is reordered to a + b (class(b) > class(a)).
marks.sort((a, b) => (swaps(b, a) ? -1 : swaps(a, b) ? 1 : 0));
const order = new Map();
let rank = 0;
for (let i = 0; i < marks.length; ++i) {
  if (i === 0 || swaps(marks[i], marks[i - 1]) || swaps(marks[i - 1], marks[i])) ++rank;
  order.set(marks[i], rank);
}
const orderRanges = [];
for (const c of [...order.keys()].sort((a, b) => a - b)) {
  const last = orderRanges[orderRanges.length - 1];
  if (last && last[1] === c - 1 && last[2] === order.get(c)) last[1] = c;
  else orderRanges.push([c, c, order.get(c)]);
}

// Primary composites: decomposable, yet NFC keeps them. Their two parts: the last code point of
// some split of the decomposition, and the composed rest.
const comps = [];
for (const [c, d] of decomp) {
  if (str(c).normalize('NFC') !== str(c)) continue;
  let found = false;
  for (let j = d.length - 1; j >= 0 && !found; --j) {
    const rest = str(...d.filter((_, k) => k !== j)).normalize('NFC');
    if (cps(rest).length !== 1) continue;
    const first = rest.codePointAt(0);
    if (str(first, d[j]).normalize('NFC') === str(c)) {
      comps.push([first, d[j], c]);
      found = true;
    }
  }
  if (!found) throw new Error('no parts found for U+' + c.toString(16));
}
comps.sort((a, b) => a[0] - b[0] || a[1] - b[1]);

// The C++ algorithm (engine/unicode.cc), in JavaScript, against node's NFC.
const compMap = new Map(comps.map(([a, b, c]) => [a * 0x110000 + b, c]));
const ccc = (c) => order.get(c) ?? 0;
function nfc(text) {
  const L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11a7, V_COUNT = 21, T_COUNT = 28;
  const buf = [];
  for (const c of cps(text)) {
    if (isHangulSyllable(c)) {
      const s = c - S_BASE;
      buf.push(L_BASE + Math.floor(s / (V_COUNT * T_COUNT)), V_BASE + Math.floor((s % (V_COUNT * T_COUNT)) / T_COUNT));
      if (s % T_COUNT) buf.push(T_BASE + (s % T_COUNT));
    } else {
      buf.push(...(decomp.get(c) ?? [c]));
    }
  }
  for (let i = 1; i < buf.length; ++i) {  // canonical order: stable insertion sort of marks
    const c = buf[i], k = ccc(c);
    if (k === 0) continue;
    let j = i;
    while (j > 0 && ccc(buf[j - 1]) > k) { buf[j] = buf[j - 1]; --j; }
    buf[j] = c;
  }
  const out = [];
  let starter = -1, last = 0;
  for (const c of buf) {
    const k = ccc(c);
    if (starter >= 0 && (out.length - 1 === starter || (last !== 0 && last < k))) {
      const s = out[starter];
      let composed = compMap.get(s * 0x110000 + c);
      if (s >= L_BASE && s < L_BASE + 19 && c >= V_BASE && c < V_BASE + V_COUNT) {
        composed = S_BASE + ((s - L_BASE) * V_COUNT + (c - V_BASE)) * T_COUNT;
      } else if (isHangulSyllable(s) && (s - S_BASE) % T_COUNT === 0 && c > T_BASE && c < T_BASE + T_COUNT) {
        composed = s + (c - T_BASE);
      }
      if (composed !== undefined) { out[starter] = composed; continue; }
    }
    if (k === 0) { starter = out.length; last = 0; } else { last = k; }
    out.push(c);
  }
  return str(...out);
}
let seed = 12345;
const rand = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const pool = [...decomp.keys(), ...marks, 0x41, 0x61, 0x1100, 0x1161, 0x11a8, 0xac00, 0xac01, 0x3b1];
let bad = 0;
const check = (s) => { if (nfc(s) !== s.normalize('NFC') && ++bad <= 10) console.error('differs:', cps(s).map((c) => c.toString(16))); };
for (let c = 0; c <= MAX; ++c) if (!isSurrogate(c)) check(str(c));
for (let i = 0; i < 300000; ++i) check(str(...Array.from({ length: 2 + rand(5) }, () => pool[rand(pool.length)])));
if (bad) { console.error(bad + ' differences from node\'s NFC'); process.exit(1); }

// Output.
const hex = (c) => '0x' + c.toString(16).toUpperCase();
// Items separated by ", ", as many to a line as fit in 100 columns.
function rows(items) {
  const lines = [];
  let line = '   ';
  for (const item of items) {
    if (line.length + item.length + 2 > 100) {
      lines.push(line);
      line = '   ';
    }
    line += ' ' + item + ',';
  }
  lines.push(line);
  return lines.join('\n');
}
const letters = ranges(/\p{L}/u), numbers = ranges(/\p{N}/u);
const words = ranges(/[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]/u);
const decompEntries = [], decompPool = [];
for (const c of [...decomp.keys()].sort((a, b) => a - b)) {
  const d = decomp.get(c);
  decompEntries.push(`{${hex(c)}, ${decompPool.length}, ${d.length}}`);
  decompPool.push(...d);
}
process.stdout.write(`// Generated by scripts/gen_unicode_tables.js from node ${process.version} (Unicode ${process.versions.unicode}); do not edit.
#include "engine/internal/unicode_tables.h"

namespace hr::engine::internal {

const CodePointRange kLetterRanges[] = {
${rows(letters.map(([a, b]) => `{${hex(a)}, ${hex(b)}}`))}
};
const size_t kNumLetterRanges = ${letters.length};

const CodePointRange kNumberRanges[] = {
${rows(numbers.map(([a, b]) => `{${hex(a)}, ${hex(b)}}`))}
};
const size_t kNumNumberRanges = ${numbers.length};

const CodePointRange kWordRanges[] = {
${rows(words.map(([a, b]) => `{${hex(a)}, ${hex(b)}}`))}
};
const size_t kNumWordRanges = ${words.length};

const CombiningRange kCombiningRanges[] = {
${rows(orderRanges.map(([a, b, r]) => `{${hex(a)}, ${hex(b)}, ${r}}`))}
};
const size_t kNumCombiningRanges = ${orderRanges.length};

const Decomposition kDecompositions[] = {
${rows(decompEntries)}
};
const size_t kNumDecompositions = ${decompEntries.length};

const uint32_t kDecompositionParts[] = {
${rows(decompPool.map(hex))}
};

const Composition kCompositions[] = {
${rows(comps.map(([a, b, c]) => `{${hex(a)}, ${hex(b)}, ${hex(c)}}`))}
};
const size_t kNumCompositions = ${comps.length};

}  // namespace hr::engine::internal
`);
console.error(`letters=${letters.length} numbers=${numbers.length} words=${words.length} combining=${orderRanges.length} (classes=${rank}) ` +
  `decompositions=${decompEntries.length} parts=${decompPool.length} compositions=${comps.length}`);
