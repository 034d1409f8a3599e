"""Application code against tokenbus, unchanged: the OpenAI Agents SDK (an agent
whose tool is called and whose answer uses the tool's result, on the Responses and
the Chat Completions models, streamed and not), the SDK's parse helpers with a
pydantic model, LangChain's with_structured_output and tool binding. Driven by
integration/apps_test.go against tokenbus dev (the sim: docs/engines.md says how it
answers with JSON and tool calls).

Usage: apps.py BASE_URL MODEL
Prints "apps ok" when everything passed; exits non-zero at the first failure.
"""
import asyncio
import sys

from pydantic import BaseModel


class City(BaseModel):
    name: str
    population: int
    coastal: bool


def check(cond, msg):
    if not cond:
        print("FAIL:", msg)
        sys.exit(1)


WEATHER = "sunny and 21 degrees"


async def agents_sdk(base, model):
    from openai import AsyncOpenAI
    from agents import (Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                        set_tracing_disabled)

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base + "/v1", api_key="unused")
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return WEATHER

    for kind in ("responses", "chat"):
        m = (OpenAIResponsesModel(model=model, openai_client=client) if kind == "responses"
             else OpenAIChatCompletionsModel(model=model, openai_client=client))
        agent = Agent(name="weather", instructions="Use the tool to answer.", tools=[get_weather], model=m)
        for streamed in (False, True):
            before = len(calls)
            if streamed:
                r = Runner.run_streamed(agent, "What is the weather in Paris?")
                async for _ in r.stream_events():
                    pass
            else:
                r = await Runner.run(agent, "What is the weather in Paris?")
            check(len(calls) == before + 1, f"agents {kind} streamed={streamed}: tool calls {calls[before:]}")
            check(WEATHER in str(r.final_output),
                  f"agents {kind} streamed={streamed}: the answer {r.final_output!r} does not use the tool's result")
    print("agents ok")


def parse_helpers(base, model):
    from openai import OpenAI

    c = OpenAI(base_url=base + "/v1", api_key="unused")
    r = c.chat.completions.parse(model=model, response_format=City,
                                 messages=[{"role": "user", "content": "Describe a city."}])
    check(isinstance(r.choices[0].message.parsed, City), f"chat.completions.parse: {r}")
    r = c.responses.parse(model=model, input="Describe a city.", text_format=City)
    check(isinstance(r.output_parsed, City), f"responses.parse: {r}")
    with c.chat.completions.stream(model=model, response_format=City,
                                   messages=[{"role": "user", "content": "Describe a city."}]) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    check(isinstance(final.choices[0].message.parsed, City), f"chat.completions.stream: {final}")
    print("parse ok")


def langchain(base, model):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=model, base_url=base + "/v1", api_key="unused")
    obj = llm.with_structured_output(City).invoke("Describe a city.")
    check(isinstance(obj, City), f"with_structured_output: {obj!r}")

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return WEATHER

    msg = llm.bind_tools([get_weather]).invoke("What is the weather in Paris?")
    check(msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather" and "city" in msg.tool_calls[0]["args"],
          f"bind_tools: {msg!r}")
    print("langchain ok")


def main(base, model):
    asyncio.run(agents_sdk(base, model))
    parse_helpers(base, model)
    langchain(base, model)
    print("apps ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
