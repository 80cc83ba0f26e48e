#!/usr/bin/env node
// Writes the tokenizer goldens of tests/data/text/: a deterministic corpus (fixed cases plus
// seeded random ones) and the ids Hugging Face `tokenizers` gives each text, for DeepSeek-V3's
// tokenizer.json and the tiny presets' (data/tokenizers/tiny/).
//
// Uses the npm package `tokenizers` (Hugging Face's Rust tokenizers with Node bindings):
//   mkdir -p /tmp/hf && (cd /tmp/hf && npm install tokenizers@0.23.2)
//   NODE_PATH=/tmp/hf/node_modules node scripts/make_tokenizer_goldens.js \
//       ../shared/data/deepseek-v3-tokenizer/tokenizer.json
// scripts/check_tokenizer_goldens.py re-encodes the committed goldens with Python `tokenizers`.
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');

const root = path.resolve(__dirname, '..');
const deepseekPath = process.argv[2] || path.join(root, '../shared/data/deepseek-v3-tokenizer/tokenizer.json');
const outDir = path.join(root, 'tests/data/text');

// A small seeded generator (mulberry32), so the corpus is the same on every run.
function rng(seed) {
  return () => {
    seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const fixed = {
  code_python: 'def merge(pairs, ranks):\n    """Merge the lowest-ranked pair."""\n    best = None\n    for i, (a, b) in enumerate(pairs):\n        if (a, b) in ranks and (best is None or ranks[(a, b)] < best[0]):\n            best = (ranks[(a, b)], i)\n    return best\n\n\n',
  code_cpp: '#include <vector>\n\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;  // double\n\treturn v.size() > 2 ? 0 : 1;\n}\n',
  code_json: '{"messages": [{"role": "user", "content": "hi"}], "tools": [], "max_tokens": 128}\n',
  code_indent_runs: 'if x:\n        y = 1\n                z = 2\n  \n    \n\t\t\tw = 3\n',
  trailing_newlines: 'line\n\n\n\n',
  trailing_spaces: 'word   ',
  only_spaces: '     ',
  only_newlines: '\n\n\n',
  crlf: 'a\r\nb\r\n\r\nc',
  cjk_chinese: '稀疏注意力只为每个查询挑选最相关的键。索引器先打分，再取前k个。',
  cjk_japanese: '東京の天気は晴れ、カタカナとひらがなを混ぜる。ソフトウェアのテスト。',
  korean: '서울의 지하철은 매우 편리합니다.',
  emoji_zwj: '👨‍👩‍👧‍👦 🏳️‍🌈 ❤️‍🔥 🧑🏿‍💻 👍🏽 🇯🇵🇫🇷 1️⃣ #️⃣',
  digits: '1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 007 ２０２６ ١٢٣٤ ²³ Ⅻ',
  whitespace_runs: 'a  b   c\t\td \n \n  e\u00a0\u00a0f\u3000g\u2003h\u180ei\u0085j\u2028k\u200bl\ufeffm',
  mixed_scripts: 'Hello мир 世界 مرحبا שלום नमस्ते สวัสดี Γειά σου Xin chào',
  contractions: "don't won't it's we'll they're I'm you've she'd",
  punctuation: '!!! ??? ... --- (a) [b] {c} <d> "e" \'f\' `g` ~h~ @i #j $k %l ^m &n *o',
  url_html: 'See https://example.com/a/b?c=1&d=2#e and <div class="x">text</div>.',
  special_tokens: '<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi!<｜Assistant｜>Hello<｜end▁of▁sentence｜>',
  special_adjacent: '<｜User｜><｜User｜><｜Assistant｜><｜end▁of▁sentence｜><｜end▁of▁sentence｜>',
  special_partial: '<｜User <｜Assistant <｜end▁of▁sentence <|EOT|> <｜tool▁sep｜>x',
  think_tags: '<think>reasoning here</think>the answer',
  tool_calls: '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
  dsml: '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
  combining: 'e\u0301 a\u0300\u0316 n\u0303 Z\u0351\u0352\u0353 ﬁ ǅ',
  long_word: 'a'.repeat(300) + ' ' + 'ab'.repeat(150) + ' ' + '中'.repeat(100),
  empty: '',
  multilingual_file: fs.readFileSync(path.join(outDir, 'multilingual.txt'), 'utf8'),
};

// Code point ranges to draw from (weights by repetition): scripts, symbols, whitespace, marks.
const ranges = [
  [0x20, 0x7e], [0x20, 0x7e], [0x20, 0x7e], [0x09, 0x0d], [0xa0, 0xff], [0x100, 0x24f],
  [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff], [0x600, 0x6ff], [0x900, 0x97f],
  [0xe00, 0xe7f], [0x1100, 0x11ff], [0x2000, 0x206f], [0x2100, 0x214f], [0x2190, 0x21ff],
  [0x3000, 0x303f], [0x3040, 0x30ff], [0x4e00, 0x9fa5], [0x4e00, 0x9fff], [0xac00, 0xd7a3],
  [0xff00, 0xffef], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f900, 0x1f9ff], [0x1f1e6, 0x1f1ff],
  [0xfe00, 0xfe0f], [0x200d, 0x200d], [0x1d400, 0x1d7ff], [0x20000, 0x2a6df],
];

function randomCodePoint(r) {
  if (r() < 0.03) {  // anywhere, assigned or not (no surrogates)
    let cp;
    do cp = Math.floor(r() * 0x110000); while (cp >= 0xd800 && cp <= 0xdfff);
    return cp;
  }
  const [lo, hi] = ranges[Math.floor(r() * ranges.length)];
  return lo + Math.floor(r() * (hi - lo + 1));
}

function randomUnicode(r, n) {
  let s = '';
  for (let i = 0; i < n; i++) s += String.fromCodePoint(randomCodePoint(r));
  return s;
}

// Short strings over an alphabet chosen to hit the pre-tokenizer's rule boundaries.
const edgeAlphabet = [' ', ' ', '  ', '\t', '\n', '\r', '\r\n', 'a', 'Z', 'é', 'ß', '1', '22', '333',
  '.', ',', '!', '(', '"', "'s", '-', '_', '中', '文', 'の', 'ア', '한', 'й', '😀', '\u200d', '\u0301',
  '\u00a0', '\u3000', '\u180e', '\u0085', '<', '｜', '<｜User｜>', '<｜Assistant｜>', '<think>', '$', '€'];

function buildCases() {
  const cases = [];
  for (const [name, text] of Object.entries(fixed)) cases.push({ name: 'fixed/' + name, text });
  const r = rng(20261203);
  for (let i = 0; i < 300; i++) {
    let s = '';
    const n = 1 + Math.floor(r() * 24);
    for (let k = 0; k < n; k++) s += edgeAlphabet[Math.floor(r() * edgeAlphabet.length)];
    cases.push({ name: `edge/${i}`, text: s });
  }
  for (let i = 0; i < 80; i++) cases.push({ name: `unicode/${i}`, text: randomUnicode(r, 1 + Math.floor(r() * 300)) });
  for (let i = 0; i < 6; i++) cases.push({ name: `long_unicode/${i}`, text: randomUnicode(r, 3000 + Math.floor(r() * 3000)) });
  const specials = ['<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>', '<｜User｜>', '<｜Assistant｜>', '<think>', '</think>', '<|EOT|>'];
  for (let i = 0; i < 40; i++) {
    let s = '';
    const n = 1 + Math.floor(r() * 6);
    for (let k = 0; k < n; k++) {
      s += randomUnicode(r, Math.floor(r() * 20));
      s += specials[Math.floor(r() * specials.length)];
    }
    cases.push({ name: `specials/${i}`, text: s });
  }
  return cases;
}

function writeGoldens(tokenizerPath, label, outName, cases) {
  const tok = Tokenizer.fromFile(tokenizerPath);
  return Promise.all(cases.map((c) => tok.encode(c.text, null, { addSpecialTokens: false })))
    .then((encodings) => {
      const out = {
        tokenizer: label,
        generator: 'Hugging Face tokenizers ' + require('tokenizers/package.json').version +
                   ' (npm), encode(text, add_special_tokens=false); scripts/make_tokenizer_goldens.js',
        cases: cases.map((c, i) => ({ name: c.name, text: c.text, ids: encodings[i].getIds() })),
      };
      const lines = out.cases.map((c) => '  ' + JSON.stringify(c));
      const header = `{"tokenizer": ${JSON.stringify(out.tokenizer)}, "generator": ${JSON.stringify(out.generator)},\n "cases": [\n`;
      fs.writeFileSync(path.join(outDir, outName), header + lines.join(',\n') + '\n]}\n');
      const tokens = out.cases.reduce((n, c) => n + c.ids.length, 0);
      console.log(`${outName}: ${cases.length} cases, ${tokens} tokens`);
    });
}

const cases = buildCases();
writeGoldens(deepseekPath, 'deepseek-v3 tokenizer.json', 'goldens_deepseek_v3.json', cases)
  .then(() => writeGoldens(path.join(root, 'data/tokenizers/tiny/tokenizer.json'), 'data/tokenizers/tiny',
                           'goldens_tiny.json', cases));
