// The official OpenAI Node client against a running `crescent serve`: node client_test.mjs BASE_URL MODEL
// Streams a chat completion and a completion, one ended by a stop string, then sends two requests sharing a
// long prefix and checks that the second reports prefix-hit (cached) tokens. Exits non-zero with a message on the first failure.
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 20000 });

// A streamed chat completion: the first chunk carries the role, then content, a finish reason, usage last.
let chat = "";
let sawRole = false;
let finish = null;
let usage = null;
const chatStream = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Say something." }],
  max_tokens: 12,
  stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of chatStream) {
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    if (choice.delta.role === "assistant") sawRole = true;
    chat += choice.delta.content ?? "";
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}
assert.ok(sawRole, "the first chat chunk names the assistant role");
assert.equal(chat.length, 12, `12 one-byte tokens streamed, got ${JSON.stringify(chat)}`);
assert.equal(finish, "length");
assert.equal(usage?.completion_tokens, 12);

// A streamed completion.
let text = "";
const stream = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 8, stream: true });
for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
assert.equal(text.length, 8, `8 tokens streamed, got ${JSON.stringify(text)}`);

// A stop string ends a streamed answer before it, with finish_reason "stop" (the same seed, the same tokens).
const whole = await client.completions.create({ model, prompt: "Stop here", max_tokens: 20, seed: 7 });
const full = whole.choices[0].text;
const stop = full.slice(10, 12);
let stopped = "";
let stopFinish = null;
const stopStream = await client.completions.create({
  model,
  prompt: "Stop here",
  max_tokens: 20,
  seed: 7,
  stop: [stop],
  stream: true,
});
for await (const chunk of stopStream) {
  stopped += chunk.choices[0]?.text ?? "";
  if (chunk.choices[0]?.finish_reason) stopFinish = chunk.choices[0].finish_reason;
}
assert.equal(stopped, full.slice(0, full.indexOf(stop)), `stopped before ${JSON.stringify(stop)} in ${JSON.stringify(full)}`);
assert.equal(stopFinish, "stop");

// Two requests sharing a 2,000-token prefix: the second is a prefix hit.
const prefix = "The same long system prompt. ".repeat(70);
const first = await client.completions.create({ model, prompt: prefix + "First question?", max_tokens: 2 });
const second = await client.completions.create({ model, prompt: prefix + "Second question?", max_tokens: 2 });
assert.equal(first.usage.prompt_tokens_details?.cached_tokens ?? 0, 0, "nothing cached yet");
const cached = second.usage.prompt_tokens_details?.cached_tokens ?? 0;
assert.ok(cached > 0, `the second request reuses the shared prefix (cached_tokens ${cached})`);

// A bad request is an APIError with the server's status and message.
await assert.rejects(client.completions.create({ model: "no-such-model", prompt: "x" }), (e) => {
  assert.equal(e.status, 404);
  assert.match(e.message, /no-such-model/);
  return true;
});

console.log(`openai client ok: chat ${JSON.stringify(chat)}, completion ${JSON.stringify(text)}, cached_tokens ${cached}`);
