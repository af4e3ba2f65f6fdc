// generateText with a tool over several steps, against responses-ws over HTTP (JSON answers).
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, isStepCount, tool } from 'ai';
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

const result = await generateText({
  model: openai.responses('emu-fast'),
  prompt: 'What is the weather in Paris and in Rome?',
  tools: { weather },
  stopWhen: isStepCount(5),
  // The emulated model calls a tool until the conversation holds 2 tool results, then answers.
  providerOptions: { openai: { metadata: { 'emulator.tool_rounds': '2' } } },
});

console.log(JSON.stringify({
  steps: result.steps.map((step) => step.finishReason),
  toolCalls: result.steps.flatMap((step) => step.toolCalls.map((call) => call.toolName)),
  executed,
  text: result.text,
  finishReason: result.finishReason,
  responseId: result.response.id,
}));
