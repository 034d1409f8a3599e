// Package httpstream is the gateway's HTTP/1.1 streaming layer under Fiber
// (fasthttp): it writes a Server-Sent Events response straight to the
// client's connection, hands the connection back to fasthttp after a clean
// end so the client's next request is served on it, and watches the client of
// a request that is silent.
//
// # Why not fasthttp's body-stream writer
//
// fasthttp's Response.SetBodyStreamWriter runs the writer on a second
// goroutine and hands every flush to the connection's goroutine over a pipe,
// which writes at most 4 KiB per syscall. A stream here is written on the
// hijacked connection instead, each burst of events (with its chunk framing,
// and the response head with the first one) in one write syscall, and the
// first burst from the handler's goroutine, not from the one fasthttp starts
// for the hijacked connection, which under load waits to be scheduled.
// BenchmarkLoopbackStream measures both writers; docs/performance.md has the
// figures.
//
// # Use
//
// New takes over one fasthttp server's hijacked connections (it sets
// KeepHijackedConns). In a handler:
//
//	w := srv.Watch(rc, waiting, cancel, errClientGone) // while the request is silent
//	...                                                 // the first frame arrives
//	st := srv.Begin(rc, w)                              // after every response header is set
//	st.WriteEvents(first)                               // "data: <line>\n\n" per line
//	st.Flush()
//	st.Run(ctx, func(st *httpstream.Stream) {           // the handler returns right after
//		... st.WriteEvents(p); st.Flush() ...           // one Flush per burst
//		st.Done()                                        // or st.Fail(e): error event, [DONE]; or st.End()
//	})
//
// # Rules
//
//   - Begin, and WriteEvents and Flush before Run, belong to the handler's
//     goroutine. Begin reads the request and the response headers set so far;
//     the response's status is always 200 and Content-Type text/event-stream.
//     After Begin the handler must call Run and then return at once; it writes
//     no other response.
//   - The function given to Run runs on another goroutine after the handler
//     has returned, when Fiber has recycled its fiber.Ctx: it must not touch
//     the fiber.Ctx or the fasthttp.RequestCtx, only what it captured. Nothing
//     recovers its panics. It owns the Stream; the Stream must not be used
//     after it returns.
//   - Flush before Run sends at once only on a connection's first request;
//     after others fasthttp may still hold a pipelined response, which must go
//     first, so the bytes wait until Run (fasthttp flushes that response
//     before the hijack). Done and Fail belong to the function given to Run.
//   - While the Run function waits for its next frame, another goroutine
//     may write for it: Ready, then WriteEvents and TryFlush, which writes
//     only what the socket takes at once and leaves the rest for the Run
//     function's next Flush (the gateway does this from the goroutine that
//     delivers the bus's frames, one goroutine wake less per token;
//     client.Stream.Direct keeps the two from overlapping).
//   - Write errors are sticky: after the first every write returns it.
//   - When Run's context ends, writes get one second more (room for a final
//     error event, no longer blocked on a client that reads nothing) and the
//     connection is not reused.
//   - After the function returns, Run stops the watcher given to Begin, then
//     hands the connection back to fasthttp (Server.ServeConn) if Done, Fail or End
//     ended the body cleanly before Run's context ended, the request was
//     HTTP/1.1 without Connection: close, and Drain has not been called; else
//     it closes it. Bytes a pipelining client sent ahead are served first.
//     HTTP/1.0 and Connection: close streams are not chunked and end with the
//     connection.
//   - Drain (for shutdown) ends keep-alive for streams begun after it and
//     closes handed-back connections still waiting for a request: fasthttp's
//     Shutdown learns of a connection given to ServeConn only when a request
//     arrives on it.
//
// # Vanished clients
//
// fasthttp has no per-request cancel signal and a write error needs
// something to write, so a Watcher probes the connection every ProbeInterval
// without a frame (Touch): on Linux and macOS a non-blocking MSG_PEEK recv,
// which reads nothing and so never eats a pipelined request; elsewhere a 1 ms
// read deadline and a one-byte Read. End of file or a socket error means the
// client hung up, and the request's context is cancelled. A client that stops
// reading while frames wait for the writer (StuckTimeout without a frame) is
// cut the same way. One goroutine probes all of a Server's watchers, and
// only while there are any (a goroutine and a ticker per request cost more
// than most requests' whole watch). No SSE comments are sent during silence: openai-go before
// v3.43 breaks on them.
//
// Tokenbus imports: internal/runners, schemas.
package httpstream
