"""Agent frameworks, end to end, against a real `hotseat serve` with SmolLM2: each runs a tool
loop (the model calls the tool, the framework runs it and sends the result back) to a final
answer. SmolLM2 (135M) calls the tool again after its result when it is free to, so each
loop is bounded with the framework's own setting for that (stop on the first tool, a tool
that returns directly, a tool offered once), never by anything on the server's side.

The `ollama` client's tool loop is in test_ollama.py, the `anthropic` client's in
test_anthropic.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.served import served

pytestmark = pytest.mark.gpu

KEY = "test-key"
ASK = "Use the get_weather tool to find the weather in Paris."
INSTRUCTIONS = "You answer questions about the weather."


def weather(city: str) -> str:
    return f"18 C, clear in {city}"


@pytest.fixture(scope="module")
def base(smollm2_path):
    with served("--ctx", "2048", "--api-key", KEY, "-m", smollm2_path) as url:
        yield url


@pytest.fixture(scope="module")
def model(base) -> str:
    import openai

    return openai.OpenAI(base_url=base + "/v1", api_key=KEY).models.list().data[0].id


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_sdk(base, model, api):
    """The Agents SDK over chat completions and over /v1/responses (its default)."""
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
    kind = agents.OpenAIChatCompletionsModel if api == "chat" else agents.OpenAIResponsesModel
    seen = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        seen.append(city)
        return weather(city)

    agent = agents.Agent(name="weather", instructions=INSTRUCTIONS,
                         model=kind(model=model, openai_client=client), tools=[get_weather],
                         tool_use_behavior="stop_on_first_tool",
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=96))
    result = agents.Runner.run_sync(agent, ASK, max_turns=3)
    assert seen == ["Paris"]
    assert result.final_output == weather("Paris")


def test_pydantic_ai_with_a_structured_result(base, model):
    """A tool, then the result type (pydantic-ai's own output tool), both calls held to their
    schemas; the weather tool is offered until it has answered (its `prepare`)."""
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    class Weather(BaseModel):
        city: str
        report: str

    async def until_answered(ctx, tool_def):
        answered = any(isinstance(p, ToolReturnPart) and p.tool_name == tool_def.name
                       for m in ctx.messages for p in m.parts)
        return None if answered else tool_def

    llm = OpenAIChatModel(model, provider=OpenAIProvider(base_url=base + "/v1", api_key=KEY))
    agent = Agent(llm, output_type=Weather, instructions=INSTRUCTIONS,
                  model_settings={"temperature": 0, "max_tokens": 96})
    seen = []

    @agent.tool_plain(prepare=until_answered)
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        seen.append(city)
        return weather(city)

    result = agent.run_sync(ASK, usage_limits=UsageLimits(request_limit=4))
    assert seen == ["Paris"]
    assert isinstance(result.output, Weather) and result.output.city == "Paris"
    assert result.output.report


def test_langchain_tool_calling_agent(base, model):
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    seen = []

    @tool(return_direct=True)
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        seen.append(city)
        return weather(city)

    llm = ChatOpenAI(model=model, base_url=base + "/v1", api_key=KEY, temperature=0,
                     max_tokens=96, max_retries=0)
    agent = create_agent(llm, tools=[get_weather], system_prompt=INSTRUCTIONS)
    out = agent.invoke({"messages": [{"role": "user", "content": ASK}]},
                       {"recursion_limit": 6})["messages"]
    assert seen == ["Paris"]
    call = out[1].tool_calls[0]
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    assert out[-1].type == "tool" and out[-1].tool_call_id == call["id"]
    assert out[-1].content == weather("Paris")


def test_llm_cli_runs_the_tool(base, model, tmp_path):
    """The `llm` CLI, the server as an OpenAI-compatible model: the call parses, the CLI runs
    the function and sends its result back. SmolLM2 then calls again, and the CLI has no
    setting that stops after a tool, so its chain limit ends the loop: this loop does not
    reach a final answer on SmolLM2."""
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: hotseat\n  model_name: {model}\n  api_base: {base}/v1\n"
        f"  api_key_name: hotseat\n  supports_tools: true\n")
    (tmp_path / "keys.json").write_text('{"hotseat": "%s"}' % KEY)
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "LLM_LOAD_PLUGINS": ""}
    code = ('def get_weather(city: str) -> str:\n'
            '    """The current weather in a city."""\n'
            '    return "18 C, clear in " + city\n')
    r = subprocess.run([sys.executable, "-m", "llm", "-m", "hotseat", "-o", "temperature", "0",
                        "-o", "max_tokens", "96", "--functions", code, "--td", "--cl", "2",
                        ASK], capture_output=True, text=True, env=env, timeout=600)
    out = r.stdout + r.stderr
    assert out.count("Tool call: get_weather({'city': 'Paris'})") == 1, out
    assert weather("Paris") in out
    # the second answer came from the request that carried the result: the limit is 2
    assert "Chain limit of 2 exceeded" in out
