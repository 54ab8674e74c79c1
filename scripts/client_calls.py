"""The calls popular client libraries make that once failed against `pml serve`, run with each
library that this interpreter can import (the others are reported as skipped): a tool call with
`tool_choice: auto` (every agent framework's default) that must come back as a call, tool
arguments held to their schema, a structured answer with a float field that must parse, and a
Responses answer that must have an output item. Greedy where the library lets it be (the
calls are the libraries' own; the answers are then reproducible). Prints a line per call and
`N passed, N failed`.

Usage: python3 scripts/client_calls.py http://127.0.0.1:8080 [--model NAME]
Install the libraries into a venv first, e.g.
  pip install openai openai-agents langchain-openai litellm instructor "pydantic-ai-slim[openai]" llm
The Node libraries' calls are in client_calls_node.cjs.
"""
import argparse
import json
import sys
import traceback

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
QUESTION = "What is the weather in Paris?"


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny and 21 degrees in {city}."


def openai_chat_auto(base, model):
    from openai import OpenAI
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], tools=[WEATHER_TOOL],
        tool_choice="auto", max_tokens=96, temperature=0)
    calls = answer.choices[0].message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather", answer.choices[0].message
    assert isinstance(json.loads(calls[0].function.arguments).get("city"), str)


def openai_responses_parse_float(base, model):
    from openai import OpenAI
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        population_millions: float

    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    answer = client.responses.parse(
        model=model, input="Name a large city and its population in millions.",
        text_format=City, max_output_tokens=96)
    assert answer.output_parsed is not None, answer


def openai_agents_tool(base, model):
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                        set_tracing_disabled)
    from openai import AsyncOpenAI
    set_tracing_disabled(True)
    calls = []

    @function_tool
    def weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return get_weather(city)

    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="none")
    # The run ends at the tool's result: what is checked is that the call came back as one.
    agent = Agent(name="assistant", instructions="Use the tools to answer.", tools=[weather],
                  model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                  model_settings=ModelSettings(temperature=0),
                  tool_use_behavior="stop_on_first_tool")
    result = Runner.run_sync(agent, QUESTION, max_turns=4)
    assert calls, f"the tool was not called: {result.final_output!r}"


def langchain_bind_tools(base, model):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    # The tool as the other calls offer it, so the prompt is theirs: a prompt a few edits from
    # one the server cached is answered with edit reuse, which may sample other tokens.
    @tool("get_weather")
    def weather(city: str) -> str:
        """Get the current weather in a city"""
        return get_weather(city)

    # An httpx client of its own: with openai 3.57 beside langchain-openai 1.4 the default one
    # fails inside httpx (an assertion on the request stream) before anything is sent.
    import httpx
    llm = ChatOpenAI(base_url=f"{base}/v1", api_key="none", model=model, max_tokens=96,
                     temperature=0, http_client=httpx.Client(timeout=600))
    message = llm.bind_tools([weather]).invoke(QUESTION)
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather", (
        f"content {message.content!r}, calls {message.tool_calls}")
    assert isinstance(message.tool_calls[0]["args"].get("city"), str), message.tool_calls


def litellm_tools(base, model):
    import litellm
    answer = litellm.completion(
        model=f"openai/{model}", api_base=f"{base}/v1", api_key="none",
        messages=[{"role": "user", "content": QUESTION}], tools=[WEATHER_TOOL], max_tokens=96,
        temperature=0)
    calls = answer.choices[0].message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather", answer.choices[0].message


def instructor_float(base, model):
    import instructor
    from openai import OpenAI
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        population_millions: float

    client = instructor.from_openai(OpenAI(base_url=f"{base}/v1", api_key="none"),
                                    mode=instructor.Mode.TOOLS)
    city = client.chat.completions.create(
        model=model, response_model=City, max_retries=1, max_tokens=96,
        messages=[{"role": "user", "content": "Name a large city and its population in millions."}])
    assert isinstance(city.population_millions, float), city


def pydantic_ai_tool(base, model):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    calls = []
    chat = OpenAIChatModel(model, provider=OpenAIProvider(base_url=f"{base}/v1", api_key="none"))
    agent = Agent(chat, instructions="Use the tools to answer.",
                  model_settings={"temperature": 0})

    @agent.tool_plain
    def weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return get_weather(city)

    result = agent.run_sync(QUESTION)
    assert calls, f"the tool was not called: {result.output!r}"


def pydantic_ai_responses(base, model):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider
    chat = OpenAIResponsesModel(model,
                                provider=OpenAIProvider(base_url=f"{base}/v1", api_key="none"))
    agent = Agent(chat, model_settings={"temperature": 0, "max_tokens": 32})
    result = agent.run_sync("Say hello.")
    assert isinstance(result.output, str), result


def llm_tool_chain(base, model):
    """`llm -T llm_version`: the tool's arguments (none) must follow its schema, so the chain
    ends with an answer instead of at its limit."""
    import os
    import tempfile

    import llm
    with tempfile.TemporaryDirectory() as home:
        with open(os.path.join(home, "extra-openai-models.yaml"), "w") as config:
            config.write(f"- model_id: pml-served\n  model_name: {model}\n"
                         f"  api_base: {base}/v1\n  supports_tools: true\n")
        os.environ["LLM_USER_PATH"] = home
        os.environ.setdefault("OPENAI_API_KEY", "none")
        served = llm.get_model("pml-served")
        calls = []
        chain = served.chain(
            "What version of llm is installed? Use the tool.",
            tools=[llm.get_tools()["llm_version"]],
            before_call=lambda _tool, call: calls.append(call.arguments),
            options={"temperature": 0, "max_tokens": 96})
        turns = 0
        for response in chain.responses():
            response.text()
            turns += 1
            if turns == 4:
                break
        assert calls, "the tool was not called"
        assert all(arguments == {} for arguments in calls), calls
        assert turns < 4, f"{turns} turns, calls {calls}"


CALLS = [
    ("openai", "chat, tools, tool_choice auto", openai_chat_auto),
    ("openai", "responses.parse, a float field", openai_responses_parse_float),
    ("agents", "Agents SDK, one function tool", openai_agents_tool),
    ("langchain_openai", "LangChain bind_tools", langchain_bind_tools),
    ("litellm", "LiteLLM completion with tools", litellm_tools),
    ("instructor", "instructor, a float field", instructor_float),
    ("pydantic_ai", "pydantic-ai, one tool", pydantic_ai_tool),
    ("pydantic_ai", "pydantic-ai, a Responses answer", pydantic_ai_responses),
    ("llm", "llm -T llm_version, a tool without arguments", llm_tool_chain),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("base", help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--model", default="pml")
    args = parser.parse_args()
    passed = failed = skipped = 0
    for module, what, call in CALLS:
        try:
            __import__(module)
        except ImportError:
            print(f"skipped  {what} ({module} is not installed)")
            skipped += 1
            continue
        try:
            call(args.base.rstrip("/"), args.model)
            print(f"passed   {what}")
            passed += 1
        except Exception as error:  # every failure is the client's report
            print(f"FAILED   {what}: {type(error).__name__}: {error}")
            traceback.print_exc(limit=2, file=sys.stderr)
            failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
