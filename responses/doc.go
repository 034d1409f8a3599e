// Package responses is OpenAI's Responses API on tokenbus: a request is
// read field by field (Parse: each honoured, passed to the engine or
// refused with a 400 naming it), made to fit its model's context (Fit,
// truncation), and run as one chat request on the bus (Items, ChatBody:
// tools, structured output, reasoning effort, logprobs in their chat
// forms), whose stream is turned into OpenAI's events as it comes (Gen:
// reasoning, message and function_call items, arguments streamed as the
// engine sends them); stored responses in the JetStream Key-Value bucket
// TOKENBUS_RESPONSES (Store, tenant-scoped, counted per tenant in
// TOKENBUS_RESPONSE_INDEX against its Quota); background responses and
// resumable chat streams run by a Runner in any gateway from the work
// queue TOKENBUS_RESPONSE_WORK (one subject and consumer per tenant, slots
// shared out by tenant), their events appended, with the expected last
// sequence, to TOKENBUS_RESPONSE_EVENTS (subject
// tokenbus.v1.responses.events.<id>), so that any gateway follows them (a
// Follow owns its consumer) and a runner that takes over from a dead one
// continues after the text already sent.
// docs/responses.md tells the design and what is not built.
//
// Tokenbus imports: client, schemas.
package responses
