// streamText with a tool over several steps, against responses-ws over HTTP (SSE streams).
import { createOpenAI } from '@ai-sdk/openai';
import { isStepCount, streamText, tool } from 'ai';
import { z } from 'zod';

const openai = createOpenAI({
  baseURL: process.env.RESPONSES_WS_BASE_URL ?? 'http://127.0.0.1:8765/v1',
  apiKey: process.env.OPENAI_API_KEY ?? 'local',
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

const result = streamText({
  model: openai.responses('emu-fast'),
  prompt: 'What is the weather in Paris and in Rome?',
  tools: { weather },
  stopWhen: isStepCount(5),
  // The emulated model calls a tool until the conversation holds 2 tool results, then answers.
  providerOptions: { openai: { metadata: { 'emulator.tool_rounds': '2' } } },
});

let streamed = '';
const errors = [];
for await (const part of result.fullStream) {
  if (part.type === 'text-delta') streamed += part.text;
  if (part.type === 'error') errors.push(String(part.error));
}

const steps = await result.steps;
console.log(JSON.stringify({
  steps: steps.map((step) => step.finishReason),
  toolCalls: steps.flatMap((step) => step.toolCalls.map((call) => call.toolName)),
  executed,
  text: await result.text,
  streamed,
  errors,
  finishReason: await result.finishReason,
  responseId: (await result.response).id,
}));
