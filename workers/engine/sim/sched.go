package sim

import (
	"context"
	"math"
	"strings"
	"time"
)

// run is the scheduler goroutine: the engine loop.
func (e *Engine) run() {
	defer close(e.exit)
	for {
		select {
		case <-e.quit:
			e.shutdown()
			return
		default:
		}
		e.takeIncoming()
		if e.kvx.hasFree.Load() {
			e.freeHeld() // holds taken by decode engines or expired (disagg.go)
		}
		if e.abortsPending.Swap(0) > 0 {
			e.sweep()
			e.publishKV()
		}
		if done := e.resetKV.Load(); done != nil && len(e.running) == 0 && e.waitingLen() == 0 {
			e.resetKV.Store(nil)
			e.dropCache() // a sleep began (sleep.go)
			close(*done)
		}
		if len(e.running) == 0 && e.waitingLen() == 0 {
			e.lastEnd = time.Time{}
			select {
			case <-e.wake:
			case <-e.quit:
				e.shutdown()
				return
			}
			continue
		}
		if !e.stepOnce() {
			e.noSteps.Add(1)
			// Sequences wait and none could be admitted: the KV cache is
			// held for remote decodes (disagg.go). Sleep until something
			// changes (a pull or expiry frees blocks, a request arrives or
			// aborts); each of those signals.
			select {
			case <-e.wake:
			case <-e.quit:
				e.shutdown()
				return
			}
		}
	}
}

func (e *Engine) waitingLen() int { return len(e.waiting) - e.wHead }

func (e *Engine) popWaiting() {
	e.waiting[e.wHead] = nil
	e.wHead++
	if e.wHead == len(e.waiting) {
		e.waiting, e.wHead = e.waiting[:0], 0
	}
}

func (e *Engine) pushFrontWaiting(s *seq) {
	if e.wHead > 0 {
		e.wHead--
		e.waiting[e.wHead] = s
		return
	}
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = s
}

// takeIncoming moves submitted sequences to the end of the waiting queue.
func (e *Engine) takeIncoming() {
	e.mu.Lock()
	in := e.incoming
	if len(in) == 0 {
		e.mu.Unlock()
		return
	}
	e.incoming = e.spare[:0]
	e.mu.Unlock()
	if e.wHead > 0 && e.wHead >= len(e.waiting)/2 {
		n := copy(e.waiting, e.waiting[e.wHead:])
		clear(e.waiting[n:])
		e.waiting, e.wHead = e.waiting[:n], 0
	}
	e.waiting = append(e.waiting, in...)
	clear(in)
	e.spare = in[:0]
}

// sweep removes aborted sequences from the batch and the queue.
func (e *Engine) sweep() {
	j := 0
	for _, s := range e.running {
		if s.state.Load() == stDone {
			e.drop(s)
			continue
		}
		e.running[j] = s
		j++
	}
	clear(e.running[j:])
	e.running = e.running[:j]

	j = e.wHead
	for i := e.wHead; i < len(e.waiting); i++ {
		s := e.waiting[i]
		if s.state.Load() == stDone {
			e.drop(s)
			continue
		}
		e.waiting[j] = s
		j++
	}
	clear(e.waiting[j:])
	e.waiting = e.waiting[:j]
	if e.wHead == j {
		e.waiting, e.wHead = e.waiting[:0], 0
	}
}

// drop forgets a sequence that has left the batch (finished or aborted) and
// ends its request when it was the last one.
func (e *Engine) drop(s *seq) {
	r := s.req
	if !r.hold || s.index != 0 || s.finish != "length" {
		s.blocks = e.kv.releaseAll(s.blocks)
	} // else kept for a remote decode: finishRequest holds or frees them (holdKV)
	if s.finish == "" {
		e.mAbort.Add(1)
	}
	r.remaining--
	if r.remaining == 0 && !r.finished {
		e.finishRequest(r)
	}
}

// preempt takes a running sequence out of the batch to free its blocks; it
// goes back to the head of the queue and is recomputed when readmitted.
func (e *Engine) preempt(s *seq) {
	e.mPreempt.Add(1)
	s.blocks = e.kv.releaseAll(s.blocks)
	s.computed, s.xfer = 0, 0 // a transferred prompt is recomputed too
	if !s.state.CompareAndSwap(stRunning, stWaiting) {
		e.drop(s) // aborted meanwhile
		return
	}
	e.nRunning.Add(-1)
	e.nWaiting.Add(1)
	e.pushFrontWaiting(s)
}

func (e *Engine) finishRequest(r *request) {
	r.finished = true
	if r.err == nil && r.aborted.Load() {
		if r.err = r.ctx.Err(); r.err == nil {
			r.err = context.Canceled
		}
	}
	if r.hold {
		e.holdKV(r) // before the answer, which says where the blocks are
	}
	if r.err == nil {
		if !r.includeUsage { // else done when the usage chunk was sent
			r.usage = r.computeUsage()
		}
		if !r.stream {
			r.response = r.buildResponse()
		}
	}
	e.publishKV() // Stats are up to date when Generate returns
	close(r.done)
}

// shutdown fails everything still queued or running with a 503.
func (e *Engine) shutdown() {
	e.mu.Lock()
	in := e.incoming
	e.incoming = nil
	e.mu.Unlock()
	err := e.errClosed()
	all := append(append(e.running, e.waiting[e.wHead:]...), in...)
	for _, s := range all {
		r := s.req
		if r.finished {
			continue
		}
		if !r.aborted.Load() {
			r.err = err
		}
		r.abort()
		e.finishRequest(r)
	}
	e.running, e.waiting, e.wHead = nil, nil, 0
}

// stepOnce schedules one step, waits for its simulated duration and emits
// one token for every sequence in the batch. ran is false when there was
// no step: nothing runs and nothing waiting could be admitted.
func (e *Engine) stepOnce() (ran bool) {
	bs := e.cfg.BlockSize
	e.step++

	// 1. Room in the KV cache for each running sequence's next token; when
	// there is none, preempt from the back of the batch (vLLM's policy).
	preempted := false
	for i := 0; i < len(e.running); i++ {
		s := e.running[i]
		self := false
		for s.computed+1 > len(s.blocks)*bs {
			if e.kv.free() > 0 {
				s.blocks = append(s.blocks, e.kv.alloc())
				continue
			}
			victim := e.running[len(e.running)-1]
			e.running[len(e.running)-1] = nil
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				self = true
				break
			}
		}
		if self {
			break
		}
		s.computed++
	}
	nDecode := len(e.running)

	// 2. Admit waiting sequences in order while the batch, the step's prefill
	// budget and the KV cache allow; not in a step that had to preempt.
	admitted, prefill := 0, 0
	for !preempted && e.waitingLen() > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		s := e.waiting[e.wHead]
		if s.state.Load() == stDone { // aborted since the last sweep
			e.popWaiting()
			e.drop(s)
			continue
		}
		hashes := s.prompt.hashes
		total := len(s.prompt.ids) + s.generated
		limit := min(len(hashes), (total-1)/bs) // at least one token is always computed
		hits, evictable := 0, 0
		for hits < limit {
			b := e.kv.lookup(hashes[hits])
			if b < 0 {
				break
			}
			if e.kv.ref[b] == 0 {
				evictable++
			}
			hits++
		}
		compute := total - hits*bs
		if s.xfer > 0 { // taken from a remote prefill: nothing to prefill (disagg.go)
			compute = total - max(hits*bs, int(s.xfer))
		}
		if admitted > 0 && prefill+compute > e.cfg.MaxNumBatchedTokens {
			break
		}
		need := (total+bs-1)/bs - hits
		if need > e.kv.free()-evictable {
			break
		}
		e.popWaiting()
		if !s.state.CompareAndSwap(stWaiting, stRunning) {
			e.drop(s)
			continue
		}
		e.nWaiting.Add(-1)
		e.nRunning.Add(1)
		for j := 0; j < hits; j++ {
			b := e.kv.lookup(hashes[j])
			e.kv.acquire(b)
			s.blocks = append(s.blocks, b)
		}
		tags := s.prompt.tags
		run := -1 // first block of the run of blocks stored here (BlockEvents)
		for j := hits; j < hits+need; j++ {
			b := e.kv.alloc()
			s.blocks = append(s.blocks, b)
			if j < len(hashes) {
				e.kv.register(b, hashes[j])
				mine := e.kv.hash[b] == hashes[j] // registered here, not a duplicate
				if j < len(tags) && mine {
					e.kv.tag[b] = tags[j]
				}
				if e.cfg.BlockEvents {
					switch {
					case mine && run < 0:
						run = j
					case !mine && run >= 0:
						e.blockEv.stored(s.prompt, run, j, bs)
						run = -1
					}
				}
			}
		}
		if run >= 0 {
			e.blockEv.stored(s.prompt, run, min(hits+need, len(hashes)), bs)
		}
		if c := e.coveredText(s.prompt, min(hits+need, len(hashes))); len(c) > 0 {
			e.kvEv.pending = append(e.kvEv.pending, c)
		}
		if !s.admitted {
			s.admitted = true
			s.cached = hits * bs
			if s.xfer > 0 {
				s.cached = max(s.cached, int(s.xfer))
				e.kvx.mXferTokens.Add(uint64(max(int(s.xfer)-hits*bs, 0)))
			}
			e.mPrompt.Add(uint64(len(s.prompt.ids)))
			e.mQueries.Add(uint64(len(s.prompt.ids)))
			e.mHits.Add(uint64(hits * bs))
		}
		s.computed = total
		prefill += compute
		if compute == 0 {
			nDecode++ // its prompt was transferred: it decodes in this step
		}
		admitted++
		e.running = append(e.running, s)
	}
	if len(e.running) == 0 {
		e.kvEv.flush()
		e.blockEv.flush()
		return false
	}

	// 3. The step's simulated duration: one wait for the whole batch.
	var cost time.Duration
	if prefill > 0 { // a sequence admitted with its prompt transferred prefills nothing: a decode step
		cost = e.cfg.PrefillBase + time.Duration(prefill)*e.cfg.PrefillPerToken
	} else {
		cost = e.cfg.DecodeBase
	}
	cost += time.Duration(nDecode) * e.cfg.DecodePerSeq
	if !e.wait(cost) {
		return true // quitting: the loop sees it
	}
	e.mSteps.Add(1)

	// 4. One token for every sequence, then one sink call per request.
	gen := 0
	for _, s := range e.running {
		if s.state.Load() == stRunning {
			e.emit(s)
			gen++
		}
	}
	e.mGen.Add(uint64(gen))
	for i, r := range e.touched {
		if len(r.buf) > 0 && r.sink != nil && !r.aborted.Load() {
			if err := r.sink.Chunks(r.buf[:len(r.buf)-1]); err != nil {
				r.err = err
				r.abort()
			}
		}
		r.buf = r.buf[:0]
		e.touched[i] = nil
	}
	e.touched = e.touched[:0]

	// 5. Sequences that finished or were aborted leave the batch.
	j := 0
	for _, s := range e.running {
		if s.state.Load() == stRunning {
			e.running[j] = s
			j++
			continue
		}
		e.drop(s)
	}
	clear(e.running[j:])
	e.running = e.running[:j]
	e.publishKV()
	e.kvEv.flush()
	e.blockEv.flush()
	return true
}

func (e *Engine) publishKV() {
	e.kvUsage.Store(math.Float64bits(float64(e.kv.used) / float64(e.kv.total())))
}

// wait sleeps until the end of a step of duration d; false if the engine is
// closing. A timer firing late does not make the simulated GPU slower: the
// next step starts when this one should have ended if that was less than a
// millisecond ago.
func (e *Engine) wait(d time.Duration) bool {
	if d <= 0 {
		e.lastEnd = time.Time{}
		return true
	}
	now := time.Now()
	start := now
	if late := now.Sub(e.lastEnd); !e.lastEnd.IsZero() && late >= 0 && late < time.Millisecond {
		start = e.lastEnd
	}
	end := start.Add(d)
	e.lastEnd = end
	sleep := end.Sub(now)
	if sleep <= 0 {
		return true
	}
	e.timer.Reset(sleep)
	select {
	case <-e.timer.C:
		return true
	case <-e.quit:
		e.timer.Stop()
		return false
	}
}

// Kinds of the previous token, for the text generator.
const (
	tkNone uint8 = iota
	tkWord
	tkComma
	tkPeriod
)

func (s *seq) rand() uint64 {
	// xorshift64*
	s.rng ^= s.rng >> 12
	s.rng ^= s.rng << 25
	s.rng ^= s.rng >> 27
	return s.rng * 2685821657736338717
}

// nextToken draws the next token's text: a word of the reasoning, a token
// of the script, or a word of the text. Every word is a single cl100k_base
// token and no two are merged by its pre-tokenizer (punctuation never
// follows punctuation), so the text has exactly one token per step. A
// natural end is a full stop.
func (s *seq) nextToken(chat bool) string {
	g := s.base + s.generated
	if g < s.reasonLen {
		return s.word(g, s.reasonLen, true)
	}
	a := g - s.reasonLen
	if s.script != nil {
		if a < len(s.script) {
			return s.script[a]
		}
		return "" // never: a sequence ends with its script
	}
	end := s.eosLen
	if s.ignoreEOS {
		end = 0
	}
	return s.word(a, end, chat)
}

// word draws the word at position pos of a text of end tokens (0: no
// natural end), which opens with a sentence starter if opening.
func (s *seq) word(pos, end int, opening bool) string {
	x := s.rand()
	pick := x >> 8
	switch {
	case pos == 0 && opening:
		s.prev = tkWord
		return starters[pick%uint64(len(starters))]
	case end > 0 && pos+1 == end && s.prev != tkComma && s.prev != tkPeriod:
		s.prev = tkPeriod
		return "."
	case s.prev == tkPeriod:
		s.prev = tkWord
		return spaceStarters[pick%uint64(len(spaceStarters))]
	case s.prev == tkWord && (end == 0 || pos+2 < end) && x&15 == 0:
		s.prev = tkComma
		return ","
	case s.prev == tkWord && (end == 0 || pos+2 < end) && x&15 == 1:
		s.prev = tkPeriod
		return "."
	}
	s.prev = tkWord
	return words[pick%uint64(len(words))]
}

// endReason is why s ends after its latest token, "" if it goes on: its
// script is done ("tool_calls" for calls), its text reached its natural
// length, or max_tokens.
func (s *seq) endReason() string {
	a := s.base + s.generated - s.reasonLen // answer tokens made
	switch {
	case a > 0 && s.script != nil && a >= len(s.script):
		if s.calls != nil {
			return "tool_calls"
		}
		return "stop"
	case a > 0 && s.script == nil && !s.ignoreEOS && a >= s.eosLen:
		return "stop"
	case s.generated >= s.maxTokens:
		return "length"
	}
	return ""
}

// callAt is the tool call whose arguments script token a is part of.
func (s *seq) callAt(a int) int {
	i := len(s.calls) - 1
	for i > 0 && s.calls[i].first > a {
		i--
	}
	return i
}

// resume draws and drops the first n tokens, so that the sequence goes on
// exactly where a failed worker's stopped (engine.Request.Resume): the same
// seed, the same draws. Usage and max_tokens count only what comes after.
func (s *seq) resume(chat bool, n int) {
	for range n {
		s.nextToken(chat)
		s.generated++
	}
	s.base, s.generated = n, 0
}

// findStop looks for a stop string that ends in text[from:] (from is where
// the newest token starts) and returns where the output ends.
func (r *request) findStop(text []byte, from int) (int, bool) {
	start := max(0, from-r.maxStop+1)
	best, bestEnd := -1, 0
	for _, st := range r.stops {
		if i := strings.Index(unsafeString(text[start:]), st); i >= 0 && (best < 0 || start+i < best) {
			best, bestEnd = start+i, start+i+len(st)
		}
	}
	if best < 0 {
		return 0, false
	}
	if r.includeStop {
		return bestEnd, true
	}
	return best, true
}

// emit produces one token for s and appends its chunks to its request's buffer.
func (e *Engine) emit(s *seq) {
	r := s.req
	if r.mark != e.step {
		r.mark = e.step
		e.touched = append(e.touched, r)
	}
	g := s.base + s.generated
	tok := s.nextToken(r.chat)
	s.generated++
	if r.logprobs {
		s.lpToks = append(s.lpToks, tok)
	}
	reasoning := g < s.reasonLen
	args := !reasoning && s.calls != nil
	reason := ""
	switch {
	case reasoning:
		if !r.stream {
			s.reasoning = append(s.reasoning, tok...)
		}
	case args:
		if !r.stream {
			s.text = append(s.text, tok...)
		}
	case r.keepText:
		old := len(s.text)
		s.text = append(s.text, tok...)
		if len(r.stops) > 0 && s.generated >= s.minTokens {
			if cut, ok := r.findStop(s.text, old); ok {
				s.text = s.text[:cut]
				reason = "stop"
			}
		}
	}
	if reason == "" {
		reason = s.endReason()
	}

	if r.stream {
		b := r.buf
		if r.chat && !s.roleSent {
			s.roleSent = true
			b = r.appendRole(b, s.index)
		}
		switch {
		case reasoning:
			b = appendDelta(b, r, s, "reasoning_content", tok)
			if reason != "" {
				b = r.appendFinish(b, s, reason)
			}
		case args:
			a := g - s.reasonLen
			i := s.callAt(a)
			if s.calls[i].first == a {
				b = r.appendCallStart(b, s, i)
			}
			b = r.appendArgs(b, s, i, tok)
			if reason != "" {
				b = r.appendFinish(b, s, reason)
			}
		case !r.keepText:
			if r.chat {
				b = appendDelta(b, r, s, "content", tok)
				if reason != "" {
					b = r.appendFinish(b, s, reason)
				}
			} else {
				b = appendText(b, r, s, tok, reason)
			}
		default:
			end := len(s.text)
			if reason == "" && !r.includeStop {
				end -= r.maxStop - 1 // hold back what may be the start of a stop string
			}
			var piece []byte
			if end > s.sent {
				piece = s.text[s.sent:end]
				s.sent = end
			}
			if r.chat {
				if len(piece) > 0 {
					b = appendDelta(b, r, s, "content", piece)
				}
				if reason != "" {
					b = r.appendFinish(b, s, reason)
				}
			} else if len(piece) > 0 || reason != "" {
				b = appendText(b, r, s, piece, reason)
			}
		}
		r.buf = b
	}

	if reason != "" && s.state.CompareAndSwap(stRunning, stDone) {
		s.finish = reason
		e.nRunning.Add(-1)
		if reason == "length" {
			e.mLength.Add(1)
		} else {
			e.mStop.Add(1) // vLLM's finished_reason: a tool call ends by a stop
		}
		r.live--
		if r.live == 0 && r.includeUsage {
			r.usage = r.computeUsage()
			r.buf = r.appendUsageChunk(r.buf)
		}
	}
}
