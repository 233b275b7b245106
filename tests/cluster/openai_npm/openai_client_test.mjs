// Drives deltaserve's OpenAI-compatible HTTP listener with the official `openai` npm client
// (pinned in package.json). Started by tests/cluster/openai_http_test.cc against a cluster of the
// tiny model carrying the real Qwen3.5 chat template (so the output is reasoning until the model
// writes </think>, which random weights never do), with one admission permit and an API key:
//   node openai_client_test.mjs BASE_URL API_KEY MODEL_ID
// Exits non-zero, naming the failed check, when anything differs from what the API promises.
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
let failures = 0;
function check(ok, what) {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures++;
}
async function expectError(promise, status, what) {
  try {
    await promise;
    check(false, `${what}: expected HTTP ${status}, got success`);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === status,
          `${what}: HTTP ${e.status} ${e.error?.type ?? ""} ${e.message}`);
  }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, "models.list lists the model");

// Chat, greedy, not streamed and streamed: the same text; usage in both.
const chatReq = { model, messages: [{ role: "user", content: "Hello there" }], max_tokens: 8,
                  temperature: 0, ignore_eos: true };
const chat = await client.chat.completions.create(chatReq);
check(chat.object === "chat.completion" && chat.choices[0].message.role === "assistant",
      "chat.completions.create answers an assistant message");
check(chat.usage.completion_tokens === 8 && chat.choices[0].finish_reason === "length",
      "chat usage and finish_reason");
const reasoning = chat.choices[0].message.reasoning_content ?? "";
check(reasoning.length > 0 && !chat.choices[0].message.content,
      "thinking on: the output is reasoning_content");
const stream = await client.chat.completions.create(
    { ...chatReq, stream: true, stream_options: { include_usage: true } });
let streamed = "";
let streamedReasoning = "";
let usage = null;
let finish = null;
for await (const chunk of stream) {
  for (const c of chunk.choices) {
    streamed += c.delta?.content ?? "";
    streamedReasoning += c.delta?.reasoning_content ?? "";
    if (c.finish_reason) finish = c.finish_reason;
  }
  if (chunk.usage) usage = chunk.usage;
}
check(streamedReasoning === reasoning && streamed === (chat.choices[0].message.content ?? ""),
      "streamed chat equals the non-streamed answer");
const noThink = await client.chat.completions.create(
    { ...chatReq, chat_template_kwargs: { enable_thinking: false } });
check(!noThink.choices[0].message.reasoning_content && noThink.choices[0].message.content.length > 0,
      "enable_thinking false: the output is content");
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather in a city",
                 parameters: { type: "object", properties: { city: { type: "string" } } } } }];
const withTools = await client.chat.completions.create({ ...chatReq, tools });
check(withTools.usage.prompt_tokens > chat.usage.prompt_tokens + 50 &&
      withTools.choices[0].finish_reason === "length",
      `tools are rendered into the prompt (${withTools.usage.prompt_tokens} vs ${chat.usage.prompt_tokens} tokens)`);
// The assistant's tool call and the tool's answer go back in as history.
const history = [...chatReq.messages,
  { role: "assistant", content: "", tool_calls: [{ id: "call_1", type: "function",
    function: { name: "get_weather", arguments: JSON.stringify({ city: "Paris" }) } }] },
  { role: "tool", tool_call_id: "call_1", content: "{\"temp\": 21}" }];
const followUp = await client.chat.completions.create({ ...chatReq, tools, messages: history });
check(followUp.usage.prompt_tokens > withTools.usage.prompt_tokens,
      "a tool-call round trip is accepted as history");
check(usage?.completion_tokens === 8 && finish === "length", "streamed usage chunk and finish");

// Completions, not streamed and streamed.
const compReq = { model, prompt: "Once upon", max_tokens: 6, temperature: 0, ignore_eos: true };
const comp = await client.completions.create(compReq);
let compStreamed = "";
for await (const chunk of await client.completions.create({ ...compReq, stream: true }))
  compStreamed += chunk.choices[0]?.text ?? "";
check(comp.choices[0].text.length > 0 && compStreamed === comp.choices[0].text,
      "completions streamed and not give the same text");

// Errors: OpenAI's error classes from our status codes.
await expectError(client.chat.completions.create({ ...chatReq, temperature: "hot" }), 400,
                  "bad temperature is a 400");
await expectError(client.chat.completions.create({ ...chatReq, model: "gpt-4o" }), 404,
                  "unknown model is a 404");
await expectError(client.chat.completions.create({ ...chatReq, tool_choice: "required", tools }),
                  400, "tool_choice required is refused by name");
await expectError(client.chat.completions.create({ ...chatReq, response_format: { type: "json_schema",
                  json_schema: { name: "x", schema: { type: "object" } } } }),
                  400, "response_format json_schema is refused by name");
// response_format json_object: constrained to one JSON object; thinking is off, so it is
// content. Random weights rarely close the object in 24 tokens: a cut answer is a prefix of one
// ("length"), a finished one parses.
const jsonReq = { model, messages: [{ role: "user", content: "Answer in JSON" }], max_tokens: 24,
                  temperature: 0, response_format: { type: "json_object" } };
const jsonChat = await client.chat.completions.create(jsonReq);
const jsonText = jsonChat.choices[0].message.content ?? "";
const jsonFinish = jsonChat.choices[0].finish_reason;
let jsonOk = jsonText.trimStart().startsWith("{") && !jsonChat.choices[0].message.reasoning_content;
if (jsonFinish === "stop") {
  try { jsonOk = jsonOk && typeof JSON.parse(jsonText) === "object"; } catch { jsonOk = false; }
} else {
  jsonOk = jsonOk && jsonFinish === "length";
}
check(jsonOk, `response_format json_object: content is a JSON object (or its prefix when cut): ${jsonFinish} ${JSON.stringify(jsonText)}`);
let jsonStreamed = "";
for await (const chunk of await client.chat.completions.create({ ...jsonReq, stream: true }))
  for (const c of chunk.choices) jsonStreamed += c.delta?.content ?? "";
check(jsonStreamed === jsonText, "response_format json_object streamed equals the non-streamed answer");
const badKey = new OpenAI({ baseURL, apiKey: "sk-wrong-key-0123456789abcdef", maxRetries: 0 });
await expectError(badKey.chat.completions.create(chatReq), 401, "a wrong key is a 401");

// Overload and cancellation: one permit. A long stream holds it, another request gets 429; the
// stream is aborted and the permit comes back at once (the slot is freed, not run to the end).
const ac = new AbortController();
const long = await client.chat.completions.create(
    { ...chatReq, max_tokens: 3000, stream: true }, { signal: ac.signal });
const it = long[Symbol.asyncIterator]();
await it.next();  // generation has started
await expectError(client.chat.completions.create(chatReq), 429, "a second request is a 429");
ac.abort();
try { while (!(await it.next()).done) {} } catch (e) { /* APIUserAbortError */ }
const t0 = Date.now();
let after = null;
while (Date.now() - t0 < 3000) {
  try {
    after = await client.chat.completions.create({ ...chatReq, max_tokens: 2 });
    break;
  } catch (e) {
    if (!(e instanceof OpenAI.RateLimitError)) throw e;
    await sleep(20);
  }
}
check(after !== null, `after abort the permit is free again (${Date.now() - t0} ms)`);

console.log(failures === 0 ? "all checks passed" : `${failures} check(s) failed`);
process.exit(failures === 0 ? 0 : 1);
