# The official Python SDK's Responses helpers against tokenbus in front of
# a scripted vLLM (issue 36; integration/responses_tools_test.go scripts
# the engine): responses.parse(text_format=Model) gets its object, the
# responses.stream helper builds parallel function calls from the argument
# deltas and parses their arguments (strict tools), and the reasoning item
# comes first. Every event and the final response are validated against
# the SDK's types.
import json, sys
from pydantic import BaseModel, TypeAdapter
from openai import OpenAI
from openai.types.responses import ResponseStreamEvent

base = sys.argv[1]
c = OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
m = "llama-8b"


class Person(BaseModel):
    name: str
    age: int


r = c.responses.parse(model=m, input="Who wrote the first program?", text_format=Person)
assert r.output_parsed == Person(name="Ada", age=36), r
assert r.text.format.type == "json_schema", r.text

weather = {"type": "function", "name": "get_weather", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}
events = TypeAdapter(ResponseStreamEvent)
types = []
with c.responses.stream(model=m, input="Weather in Paris and Lyon?", tools=[weather], tool_choice="required", reasoning={"effort": "low"}) as s:
    for ev in s:
        events.validate_python(ev.to_dict())
        types.append(ev.type)
    final = s.get_final_response()
assert types.count("response.function_call_arguments.delta") == 3, types
assert [o.type for o in final.output] == ["reasoning", "function_call", "function_call"], final.output
assert final.output[0].content[0].text == "Two cities: two calls.", final.output[0]
calls = final.output[1:]
assert [(fc.call_id, fc.arguments) for fc in calls] == [("call_paris", '{"city": "Paris"}'), ("call_lyon", '{"city": "Lyon"}')], calls
assert [fc.parsed_arguments for fc in calls] == [{"city": "Paris"}, {"city": "Lyon"}], calls

nxt = c.responses.create(model=m, previous_response_id=final.id, tools=[weather], include=["message.output_text.logprobs"],
                         input=[{"type": "function_call_output", "call_id": fc.call_id, "output": o} for fc, o in zip(calls, ["20C", "18C"])])
assert nxt.output_text == "Paris 20C, Lyon 18C", nxt
assert [lp.token for lp in nxt.output[0].content[0].logprobs] == ["Paris 20C", ", Lyon 18C"], nxt.output[0]
print("python responses tools ok")
