"""OpenAI's Agents SDK (`openai-agents`) as a new user runs it against `pml serve` on the default
model: the default agent with one `@function_tool`, no `max_tokens` anywhere, through the
Responses API (the SDK's default) and through Chat Completions, each run plain and streamed. The
agent must get its tool call (`stop_on_first_tool`: the tool's output is the run's answer), and a
plain question must get an answer that is not cut off at 16 tokens.

Run by tests/openai_client.rs: `python openai_agents.py BASE_URL`. Each check prints one line;
the first failure raises and the process exits non-zero.
"""

import asyncio
import json
import sys

import openai
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from openai_client_checks import check

BASE = sys.argv[1].rstrip("/")
# The SDK's traces go to OpenAI's servers; none are reachable from here.
set_tracing_disabled(True)
client = openai.AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)
calls = []


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    calls.append(city)
    return f"Sunny and 22 degrees in {city}."


def agent(model, tools):
    return Agent(
        name="Assistant",
        instructions="You are a helpful assistant.",
        model=model,
        tools=tools,
        tool_use_behavior="stop_on_first_tool",
        # Greedy, so the run is the same every time; no token limit, as the SDK sends none.
        model_settings=ModelSettings(temperature=0),
    )


async def run(name, model, streamed):
    before = len(calls)
    weather = agent(model, [get_weather])
    question = "What is the weather in Paris? Use the get_weather tool."
    if streamed:
        result = Runner.run_streamed(weather, question, max_turns=2)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(weather, question, max_turns=2)
    check(f"{name}: the tool was called", len(calls) == before + 1, calls)
    check(f"{name}: with a city", "paris" in calls[-1].lower(), calls[-1])
    check(f"{name}: the tool's output is the answer", "22 degrees" in str(result.final_output),
          result.final_output)


async def answer_in_full(name, model):
    plain = agent(model, [])
    result = await Runner.run(plain, "Count from 1 to 30, separated by spaces.", max_turns=1)
    response = result.raw_responses[-1]
    tokens = response.usage.output_tokens
    check(f"{name}: a plain answer is not cut at 16 tokens", tokens > 16, tokens)
    check(f"{name}: it runs to the end", "29 30" in str(result.final_output), result.final_output)


async def main():
    models = {
        "responses": OpenAIResponsesModel(model="pml", openai_client=client),
        "chat completions": OpenAIChatCompletionsModel(model="pml", openai_client=client),
    }
    for name, model in models.items():
        await run(f"{name}", model, streamed=False)
        await run(f"{name}, streamed", model, streamed=True)
        await answer_in_full(name, model)
    print(json.dumps({"passed": True}))


asyncio.run(main())
