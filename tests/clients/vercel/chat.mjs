// streamText with a tool over several steps, then a second turn that continues the chat,
// against responses-ws.  RESPONSES_WS_TRANSPORT=websocket (the default): over the AI SDK's
// WebSocket transport — the provider's `fetch` is createWebSocketFetch() from
// @vercel/ai-sdk-openai-websocket-fetch, which sends every streaming create as a
// `response.create` on one socket; `http`: the provider's own fetch (SSE streams).
import { createOpenAI } from '@ai-sdk/openai';
import { createWebSocketFetch } from '@vercel/ai-sdk-openai-websocket-fetch';
import { isStepCount, streamText, tool } from 'ai';
import { z } from 'zod';

const baseURL = process.env.RESPONSES_WS_BASE_URL ?? 'http://127.0.0.1:8765/v1';
const overWebSocket = (process.env.RESPONSES_WS_TRANSPORT ?? 'websocket') === 'websocket';
const wsFetch = overWebSocket ? createWebSocketFetch({ url: baseURL.replace(/^http/, 'ws') + '/responses' }) : null;
// Anything the transport does not take over would go to the global fetch: count it.
const httpCalls = [];
const realFetch = globalThis.fetch;
globalThis.fetch = (input, init) => {
  httpCalls.push(`${init?.method ?? 'GET'} ${input instanceof Request ? input.url : String(input)}`);
  return realFetch(input, init);
};
const openai = createOpenAI({
  baseURL,
  apiKey: process.env.OPENAI_API_KEY ?? 'local',
  ...(wsFetch ? { fetch: wsFetch } : {}),
});

const executed = [];
const weather = tool({
  description: 'Get the weather in a city',
  inputSchema: z.object({ city: z.string() }),
  execute: async ({ city }) => {
    executed.push(city);
    return { city, celsius: 18 };
  },
});

async function turn(messages, rounds) {
  const result = streamText({
    model: openai.responses('emu-fast'),
    messages,
    tools: { weather },
    stopWhen: isStepCount(5),
    include: { requestBody: true }, // each step's request body, to report what was sent
    // The emulated model calls a tool until the conversation holds `rounds` tool results.
    providerOptions: { openai: { metadata: { 'emulator.tool_rounds': String(rounds) } } },
  });
  let streamed = '';
  const errors = [];
  for await (const part of result.fullStream) {
    if (part.type === 'text-delta') streamed += part.text;
    if (part.type === 'error') errors.push(String(part.error));
  }
  const steps = await result.steps;
  return {
    steps: steps.map((step) => step.finishReason),
    toolCalls: steps.flatMap((step) => step.toolCalls.map((call) => call.toolName)),
    responseIds: steps.map((step) => step.response.id),
    requests: steps.map((step) => step.request.body),
    text: await result.text,
    streamed,
    errors,
    finishReason: await result.finishReason,
    responseId: (await result.response).id,
    messages: (await result.response).messages,
  };
}

const question = { role: 'user', content: 'What is the weather in Paris and in Rome?' };
const first = await turn([question], 2);
// The chat goes on: the AI SDK sends the first turn's answer back as an item_reference
// (store is on by default), which the server must resolve to that message.
const second = await turn(
  [question, ...first.messages, { role: 'user', content: 'Thanks. Summarise that in one line.' }],
  3,
);
wsFetch?.close();

const lastRequest = second.requests[0];
const body = typeof lastRequest === 'string' ? JSON.parse(lastRequest) : lastRequest;
console.log(JSON.stringify({
  ...first,
  requests: undefined,
  messages: undefined,
  executed,
  httpCalls,
  second: { ...second, requests: undefined, messages: undefined },
  secondInput: body?.input ?? null,
}));
