# The official Python SDK's Responses API against tokenbus (issue 17):
# create (plain, streamed, with the stream helper), previous_response_id,
# retrieve, input_items, delete, background with retrieve(stream=True,
# starting_after=N), cancel.
import sys, time
from openai import OpenAI, NotFoundError

base = sys.argv[1]
c = OpenAI(base_url=base + "/v1", api_key="none")
m = "llama-8b"

r = c.responses.create(model=m, input="hello", max_output_tokens=8, instructions="be brief")
assert r.object == "response" and r.status in ("completed", "incomplete"), r
assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text", r.output
assert r.output_text, r
assert r.usage.output_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage

types, text = [], ""
for ev in c.responses.create(model=m, input=[{"role": "user", "content": "hi"}], max_output_tokens=8, stream=True):
    types.append(ev.type)
    if ev.type == "response.output_text.delta":
        text += ev.delta
assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"], types
assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"] or types[-1] == "response.completed", types

with c.responses.stream(model=m, input="stream helper") as s:
    for ev in s:
        pass
    final = s.get_final_response()
assert final.output_text and final.id.startswith("resp_"), final

r2 = c.responses.create(model=m, input="and then?", previous_response_id=r.id, max_output_tokens=4)
assert r2.previous_response_id == r.id and r2.usage.input_tokens > r.usage.input_tokens, (r2.usage, r.usage)
got = c.responses.retrieve(r.id)
assert got.id == r.id and got.output_text == r.output_text
items = c.responses.input_items.list(r.id)
assert items.data[0].type == "message", items
d = c.responses.delete(r2.id)
try:
    c.responses.retrieve(r2.id)
    raise SystemExit("deleted response still there")
except NotFoundError:
    pass

b = c.responses.create(model=m, input="background", max_output_tokens=40, background=True)
assert b.status in ("queued", "in_progress"), b
seen = []
for ev in c.responses.retrieve(b.id, stream=True, starting_after=2):
    seen.append(ev.sequence_number)
assert seen[0] == 3 and seen == list(range(3, 3 + len(seen))), seen
while (b := c.responses.retrieve(b.id)).status in ("queued", "in_progress"):
    time.sleep(0.05)
assert b.status == "incomplete" and b.output_text, b

bc = c.responses.create(model=m, input="cancel me", max_output_tokens=5000, background=True)
cr = c.responses.cancel(bc.id)
assert cr.status == "cancelled", cr
print("python responses ok")
