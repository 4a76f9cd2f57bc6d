// The official OpenAI Node SDK, unchanged, against a running headroom: upload a JSONL of reversal
// requests, create a batch, poll it until it ends, read the output file and compare every line with
// the bundled model's answer; then the SDK's view of errors, a batch whose file fails validation,
// listing, cancelling and deleting; tools and structured output (zod through the SDK's parse
// helper, required and named tool calls plain and streamed, a batch file using both). Environment: HEADROOM_BASE_URL (…/v1), HEADROOM_API_KEY,
// HEADROOM_MODEL. Exits non-zero on the first mismatch; prints one JSON summary line at the end.
import assert from 'node:assert/strict';
import OpenAI, { toFile, NotFoundError, BadRequestError } from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';

const client = new OpenAI({
  baseURL: process.env.HEADROOM_BASE_URL,
  apiKey: process.env.HEADROOM_API_KEY,
  maxRetries: 0,
});
const model = process.env.HEADROOM_MODEL;
const terminal = new Set(['completed', 'failed', 'expired', 'cancelled']);

// Words the bundled model reverses correctly with greedy decoding.
const words = [
  'hello', 'world', 'batch', 'queue', 'lantern', 'candle', 'planet', 'mosaic', 'copper', 'violet',
  'harbor', 'pencil', 'meadow', 'rocket', 'velvet', 'winter', 'garden', 'silver', 'orange', 'bridge',
];
const reverse = (s) => [...s].reverse().join('');

function jsonl(items) {
  return items.map((x) => JSON.stringify(x)).join('\n') + '\n';
}

function line(customId, text) {
  return {
    custom_id: customId,
    method: 'POST',
    url: '/v1/chat/completions',
    body: {
      model,
      messages: [{ role: 'user', content: `reverse: ${text}` }],
      max_tokens: 40,
      temperature: 0,
    },
  };
}

async function waitUntilDone(id, seconds) {
  const seen = [];
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const b = await client.batches.retrieve(id);
    if (seen[seen.length - 1] !== b.status) seen.push(b.status);
    assert.ok(b.request_counts.completed + b.request_counts.failed <= b.request_counts.total);
    if (terminal.has(b.status)) return { batch: b, seen };
    assert.ok(Date.now() < deadline, `batch ${id} still ${b.status} after ${seconds}s`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function main() {
  const started = Date.now();
  // 1. Upload.
  const input = jsonl(words.map((w, i) => line(`rev-${i}`, w)));
  const file = await client.files.create({
    file: await toFile(Buffer.from(input), 'reversals.jsonl'),
    purpose: 'batch',
  });
  assert.equal(file.object, 'file');
  assert.equal(file.purpose, 'batch');
  assert.equal(file.status, 'processed');
  assert.equal(file.filename, 'reversals.jsonl');
  assert.equal(file.bytes, Buffer.byteLength(input));
  assert.equal((await client.files.retrieve(file.id)).id, file.id);
  const listed = [];
  for await (const f of client.files.list()) listed.push(f.id);
  assert.ok(listed.includes(file.id));
  const roundTrip = await (await client.files.content(file.id)).text();
  assert.equal(roundTrip, input);

  // 2. Batch: create, poll, read the output.
  const batch = await client.batches.create({
    input_file_id: file.id,
    endpoint: '/v1/chat/completions',
    completion_window: '24h',
    metadata: { suite: 'openai-sdk' },
  });
  assert.equal(batch.object, 'batch');
  assert.equal(batch.endpoint, '/v1/chat/completions');
  assert.ok(['validating', 'in_progress'].includes(batch.status), batch.status);
  assert.equal(batch.request_counts.total, words.length);
  assert.deepEqual(batch.metadata, { suite: 'openai-sdk' });
  const { batch: done, seen } = await waitUntilDone(batch.id, 120);
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.deepEqual(done.request_counts, { total: words.length, completed: words.length, failed: 0 });
  assert.equal(done.error_file_id, null);
  assert.ok(done.output_file_id);
  assert.ok(done.completed_at >= done.created_at);
  const outText = await (await client.files.content(done.output_file_id)).text();
  const outLines = outText.trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(outLines.length, words.length);
  const byId = new Map(outLines.map((l) => [l.custom_id, l]));
  words.forEach((w, i) => {
    const l = byId.get(`rev-${i}`);
    assert.ok(l, `no output line for rev-${i}`);
    assert.equal(l.error, null);
    assert.equal(l.response.status_code, 200);
    const body = l.response.body;
    assert.equal(body.object, 'chat.completion');
    assert.equal(body.model, model);
    assert.equal(body.choices[0].message.role, 'assistant');
    assert.equal(body.choices[0].message.content, reverse(w), `rev-${i}: ${w}`);
    assert.equal(body.choices[0].finish_reason, 'stop');
    assert.ok(body.usage.prompt_tokens > 0 && body.usage.completion_tokens > 0);
  });
  const outFile = await client.files.retrieve(done.output_file_id);
  assert.equal(outFile.purpose, 'batch_output');
  assert.equal(outFile.bytes, Buffer.byteLength(outText));
  const batchIds = [];
  for await (const b of client.batches.list({ limit: 2 })) batchIds.push(b.id);
  assert.ok(batchIds.includes(batch.id));

  // 3. Errors come back as the SDK's typed errors, with our message.
  await assert.rejects(client.batches.retrieve('0190a000-0000-7000-8000-000000000000'), (e) => {
    assert.ok(e instanceof NotFoundError, String(e));
    assert.match(e.message, /no such batch/);
    return true;
  });
  await assert.rejects(
    client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions',
                            completion_window: 'soon' }),
    (e) => {
      assert.ok(e instanceof BadRequestError, String(e));
      assert.equal(e.param, 'completion_window');
      return true;
    });

  // 3b. A batch's priority (docs/fair-share.md): from the metadata (its values are strings) or as
  // an extra field the SDK passes through; a bad one is a BadRequestError naming it.
  const urgent = await client.batches.create({
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h',
    metadata: { priority: '7' } });
  assert.equal(urgent.priority, 7);
  const urgent2 = await client.batches.create({
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h',
    priority: -3 });
  assert.equal((await client.batches.retrieve(urgent2.id)).priority, -3);
  await assert.rejects(
    client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions',
                            completion_window: '24h', priority: 1000 }),
    (e) => {
      assert.ok(e instanceof BadRequestError, String(e));
      assert.equal(e.param, 'priority');
      return true;
    });

  // 4. A file with a bad line: the batch fails validation, with the line named.
  const badInput = jsonl([line('a', 'x'), { ...line('b', 'y'), url: '/v1/embeddings' }]);
  const badFile = await client.files.create({
    file: await toFile(Buffer.from(badInput), 'bad.jsonl'), purpose: 'batch' });
  const failed = await client.batches.create({
    input_file_id: badFile.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  const failedNow = (await waitUntilDone(failed.id, 10)).batch;
  assert.equal(failedNow.status, 'failed');
  assert.equal(failedNow.errors.data[0].line, 2);
  assert.equal(failedNow.errors.data[0].code, 'invalid_url');

  // 5. Cancel: the batch ends cancelled; whatever finished is kept.
  const many = jsonl(Array.from({ length: 200 }, (_, i) => line(`c-${i}`, `w${i}abcdefghij`)));
  const manyFile = await client.files.create({
    file: await toFile(Buffer.from(many), 'many.jsonl'), purpose: 'batch' });
  const toCancel = await client.batches.create({
    input_file_id: manyFile.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  const cancelling = await client.batches.cancel(toCancel.id);
  assert.ok(['cancelling', 'cancelled'].includes(cancelling.status), cancelling.status);
  const cancelled = (await waitUntilDone(toCancel.id, 60)).batch;
  assert.equal(cancelled.status, 'cancelled');
  assert.equal(cancelled.request_counts.completed + cancelled.request_counts.failed, 200);
  assert.ok(cancelled.error_file_id);
  const cancelErrors = (await (await client.files.content(cancelled.error_file_id)).text())
    .trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(cancelErrors.length, cancelled.request_counts.failed);
  assert.ok(cancelErrors.every((l) => l.error.code === 'batch_cancelled'));

  // 5b. Retention, retry and delete (docs/retention.md): expires_after and output_expires_after
  // as the SDK sends them; the cancelled batch's unfinished requests run again; deleting refuses a
  // running batch and removes an ended one.
  const kept = await client.files.create({
    file: await toFile(Buffer.from(input), 'kept.jsonl'), purpose: 'batch',
    expires_after: { anchor: 'created_at', seconds: 3600 } });
  assert.equal(kept.expires_at, kept.created_at + 3600);
  const retained = await client.batches.create({
    input_file_id: kept.id, endpoint: '/v1/chat/completions', completion_window: '24h',
    output_expires_after: { anchor: 'created_at', seconds: 7200 } });
  assert.equal(retained.data_expires_at, retained.created_at + 7200);
  const retry = await client.post(`/batches/${cancelled.id}/retry`, {});
  assert.equal(retry.retried_from, cancelled.id);
  assert.equal(retry.request_counts.total, cancelled.request_counts.failed);
  await assert.rejects(client.delete(`/batches/${retry.id}`), (e) => e.status === 409);
  assert.equal((await waitUntilDone(retry.id, 60)).batch.status, 'completed');
  const batchDeleted = await client.delete(`/batches/${cancelled.id}`);
  assert.deepEqual(batchDeleted, { id: cancelled.id, object: 'batch.deleted', deleted: true });
  await assert.rejects(client.batches.retrieve(cancelled.id), (e) => e.status === 404);
  assert.deepEqual((await client.batches.retrieve(retry.id)).retried_from, cancelled.id);

  // 6. Tools through the SDK: offered, with an earlier call and its result in the conversation;
  // the bundled model answers in text (its template takes no tools), so the answer has no calls.
  // Streamed with tools, the SDK reassembles the text; a tool_choice naming no tool is refused.
  const tools = [{ type: 'function', function: { name: 'lookup', description: 'Looks a word up',
    parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] } } }];
  const withTools = await client.chat.completions.create({
    model, temperature: 0, tools, tool_choice: 'auto',
    messages: [
      { role: 'user', content: 'reverse: abc' },
      { role: 'assistant', content: null, tool_calls: [
        { id: 'call_1', type: 'function', function: { name: 'lookup', arguments: '{"q":"abc"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'found' },
      { role: 'user', content: 'reverse: hello' }],
  });
  assert.equal(withTools.object, 'chat.completion');
  assert.equal(typeof withTools.choices[0].message.content, 'string');
  assert.notEqual(withTools.choices[0].finish_reason, 'tool_calls');
  const toolStream = await client.chat.completions.create({ model, tools, stream: true,
    temperature: 0, messages: [{ role: 'user', content: 'reverse: hello' }] });
  let toolText = '';
  let toolFinish = null;
  for await (const chunk of toolStream) {
    if (chunk.choices.length === 0) continue;
    toolText += chunk.choices[0].delta.content ?? '';
    assert.equal(chunk.choices[0].delta.tool_calls, undefined);
    toolFinish = chunk.choices[0].finish_reason ?? toolFinish;
  }
  assert.equal(toolText, 'olleh');
  assert.equal(toolFinish, 'stop');
  await assert.rejects(
    client.chat.completions.create({ model, tools, tool_choice: { type: 'function',
      function: { name: 'nope' } }, messages: [{ role: 'user', content: 'reverse: x' }] }),
    (e) => {
      assert.ok(e instanceof BadRequestError, String(e));
      assert.equal(e.param, 'tool_choice.function.name');
      return true;
    });

  // 7. Structured output. A zod schema through the SDK's own helper: the answer parses and
  // satisfies the schema (sampled, not greedy: the bundled model knows no JSON).
  const Word = z.object({
    word: z.string().max(12),
    letters: z.number().int(),
    kind: z.enum(['noun', 'verb', 'other']),
    tags: z.array(z.string()).max(3),
    note: z.string().nullable(),
  });
  for (const seed of [1, 2, 3]) {
    const parsed = await client.chat.completions.parse({
      model, temperature: 1, seed, max_tokens: 100,
      messages: [{ role: 'user', content: 'reverse: json' }],
      response_format: zodResponseFormat(Word, 'word_info'),
    });
    assert.equal(parsed.choices[0].finish_reason, 'stop');
    Word.parse(parsed.choices[0].message.parsed);
  }
  // A schema keyword the grammar engine does not support is refused by name.
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'reverse: x' }],
      response_format: { type: 'json_schema', json_schema: { name: 'n', schema: {
        type: 'object', properties: { e: { type: 'string', format: 'email' } } } } } }),
    (e) => {
      assert.ok(e instanceof BadRequestError, String(e));
      assert.equal(e.param, 'response_format.json_schema.schema.properties.e.format');
      return true;
    });
  // tool_choice required, streamed: the SDK reassembles the calls from their deltas.
  const toolMessages = [{ role: 'user', content: 'reverse: abc' }];
  const runner = client.chat.completions.stream({ model, tools, tool_choice: 'required',
    temperature: 1, seed: 5, max_tokens: 90, messages: toolMessages });
  let callChunks = 0;
  runner.on('chunk', (chunk) => { callChunks += chunk.choices[0]?.delta?.tool_calls ? 1 : 0; });
  const streamed = await runner.finalChatCompletion();
  assert.ok(callChunks > 3, `the call streamed in ${callChunks} chunks, not as it was written`);
  assert.equal(streamed.choices[0].finish_reason, 'tool_calls');
  const streamedCalls = streamed.choices[0].message.tool_calls;
  assert.ok(streamedCalls.length >= 1);
  for (const c of streamedCalls) {
    assert.equal(c.function.name, 'lookup');
    assert.equal(typeof JSON.parse(c.function.arguments).q, 'string');
    assert.match(c.id, /^call_/);
  }
  // A named function, not streamed: one call to it.
  const twoTools = [...tools, { type: 'function', function: { name: 'count',
    parameters: { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 } },
      required: ['n'], additionalProperties: false } } }];
  const named = await client.chat.completions.create({ model, tools: twoTools, temperature: 1,
    seed: 9, max_tokens: 100, tool_choice: { type: 'function', function: { name: 'count' } },
    messages: toolMessages });
  assert.equal(named.choices[0].finish_reason, 'tool_calls');
  assert.equal(named.choices[0].message.tool_calls.length, 1);
  assert.equal(named.choices[0].message.tool_calls[0].function.name, 'count');
  const n = JSON.parse(named.choices[0].message.tool_calls[0].function.arguments).n;
  assert.ok(Number.isInteger(n) && n >= 0 && n <= 9, String(n));
  // A batch file whose lines use response_format and tools.
  const structuredLines = [
    { custom_id: 'schema', method: 'POST', url: '/v1/chat/completions', body: { model,
      messages: [{ role: 'user', content: 'reverse: a' }], temperature: 1, seed: 4, max_tokens: 100,
      response_format: zodResponseFormat(Word, 'word_info') } },
    { custom_id: 'object', method: 'POST', url: '/v1/chat/completions', body: { model,
      messages: [{ role: 'user', content: 'reverse: b' }], temperature: 1, seed: 5, max_tokens: 80,
      response_format: { type: 'json_object' } } },
    { custom_id: 'tools', method: 'POST', url: '/v1/chat/completions', body: { model,
      messages: toolMessages, temperature: 1, seed: 6, max_tokens: 100, tools: twoTools,
      tool_choice: 'required', parallel_tool_calls: false } },
  ];
  const structuredFile = await client.files.create({
    file: await toFile(Buffer.from(jsonl(structuredLines)), 'structured.jsonl'), purpose: 'batch' });
  const structuredBatch = await client.batches.create({ input_file_id: structuredFile.id,
    endpoint: '/v1/chat/completions', completion_window: '24h' });
  const { batch: structuredDone } = await waitUntilDone(structuredBatch.id, 120);
  assert.equal(structuredDone.status, 'completed');
  const structuredOut = Object.fromEntries(
    (await (await client.files.content(structuredDone.output_file_id)).text()).trim().split('\n')
      .map((l) => JSON.parse(l)).map((l) => [l.custom_id, l.response.body.choices[0]]));
  Word.parse(JSON.parse(structuredOut.schema.message.content));
  const obj = JSON.parse(structuredOut.object.message.content);
  assert.ok(obj !== null && typeof obj === 'object' && !Array.isArray(obj));
  assert.equal(structuredOut.tools.finish_reason, 'tool_calls');
  assert.equal(structuredOut.tools.message.tool_calls.length, 1);
  const call = structuredOut.tools.message.tool_calls[0];
  assert.ok(['lookup', 'count'].includes(call.function.name));
  assert.equal(typeof JSON.parse(call.function.arguments), 'object');

  // 7b. service_tier flex through the SDK unchanged: answered, the tier echoed (also streamed).
  const flex = await client.chat.completions.create({ model, temperature: 0, service_tier: 'flex',
    messages: [{ role: 'user', content: 'reverse: flex' }] });
  assert.equal(flex.service_tier, 'flex');
  assert.equal(flex.choices[0].message.content, 'xelf');
  const plain = await client.chat.completions.create({ model, temperature: 0,
    messages: [{ role: 'user', content: 'reverse: flex' }] });
  assert.equal(plain.service_tier, 'default');
  const flexStream = await client.chat.completions.create({ model, temperature: 0, stream: true,
    service_tier: 'flex', messages: [{ role: 'user', content: 'reverse: flex' }] });
  let flexText = '';
  for await (const chunk of flexStream) {
    assert.equal(chunk.service_tier, 'flex');
    if (chunk.choices.length > 0) flexText += chunk.choices[0].delta.content ?? '';
  }
  assert.equal(flexText, 'xelf');

  // 8. Delete a file.
  const deleted = await client.files.delete(badFile.id);
  assert.deepEqual(deleted, { id: badFile.id, object: 'file', deleted: true });
  await assert.rejects(client.files.retrieve(badFile.id), NotFoundError);

  console.log(JSON.stringify({
    ok: true, requests: words.length, statuses_seen: seen,
    cancelled_completed: cancelled.request_counts.completed, seconds: (Date.now() - started) / 1000,
  }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
