package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
)

// words are common English words that are one token each (with their leading
// space) in the Llama 3, GPT-4 and Qwen vocabularies, so a prompt of N words is
// about N tokens.
var words = strings.Fields(`
the of and to in is was for on that with as by at from his it an were are which
this be or had not have one their has but first after its new who they two her
been she all other when there time during also into would more school only over
city most some later three up out years about world can used may him state such
family many then year before under both team since where music through while war
film these series known being united area between including no second well each
people part life work four made if until like than national we could high five
season what game so home age end group back last early named town day found old
water number small same place name great long good down right word house large
way left open power point side form line order set show case run book land light
sound play round hand head face body love king market money table paper report
study field night river story color heart class voice court price model space
level energy board stone mind force plant value green black white blue red gold
glass wood iron south north east west center island street road bridge church
party union club member player leader doctor artist writer teacher worker farmer
student child mother father brother sister friend woman man girl boy horse bird
tree flower fire earth air sun moon star sea lake hill valley forest garden
station train ship car plane engine machine system program process method design
plan
`)

// promptSpec is one request's content before it becomes a JSON body.
type promptSpec struct {
	prompt    string          // completions prompt, or the single user message
	messages  json.RawMessage // chat messages from a dataset, passed through untouched
	outputLen int             // max_tokens; 0 = leave to the server
	inputEst  int             // estimated prompt tokens (words), when usage is missing
}

// randomWords appends n words drawn from the word list.
func randomWords(b *strings.Builder, rng *rand.Rand, n int) {
	for i := 0; i < n; i++ {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
}

// sharedPrefix returns the n-word prefix every prompt starts with. It comes from
// its own generator so that it does not change the prompts after it.
func sharedPrefix(seed uint64, n int) string {
	if n <= 0 {
		return ""
	}
	var b strings.Builder
	randomWords(&b, rand.New(rand.NewPCG(seed, 0x5eed_ba5e)), n)
	return b.String()
}

// randomPrompts makes n prompts of prefixLen+inputLen words. With groups > 0
// there are that many prefixes and prompt i gets prefix i mod groups, in
// shuffled order (many system prompts, several questions each: the workload
// prefix-aware routing is for); in chat the prefix is a system message.
func randomPrompts(seed uint64, stream uint64, n, prefixLen, inputLen, outputLen, groups int, endpoint string) []promptSpec {
	rng := rand.New(rand.NewPCG(seed, stream))
	prefixes := []string{sharedPrefix(seed, prefixLen)}
	if groups > 0 {
		prefixes = make([]string, groups)
		for g := range prefixes {
			prefixes[g] = sharedPrefix(seed+uint64(g)*0x9e3779b97f4a7c15, prefixLen)
		}
	}
	out := make([]promptSpec, n)
	for i := range out {
		prefix := prefixes[i%len(prefixes)]
		var b strings.Builder
		b.Grow((len(prefix) + 1 + inputLen*7))
		if groups == 0 || endpoint != "chat" {
			b.WriteString(prefix)
		}
		randomWords(&b, rng, inputLen)
		out[i] = promptSpec{prompt: b.String(), outputLen: outputLen, inputEst: prefixLen + inputLen}
		if groups > 0 && endpoint == "chat" {
			out[i].messages, _ = json.Marshal([]chatMessage{{Role: "system", Content: prefix}, {Role: "user", Content: out[i].prompt}})
		}
	}
	if groups > 0 {
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	}
	return out
}

// datasetLine is one line of a --dataset file.
type datasetLine struct {
	Prompt    *string         `json:"prompt"`
	Messages  json.RawMessage `json:"messages"`
	OutputLen *int            `json:"output_len"`
}

// loadDataset reads a JSONL file of {"prompt": "...", "output_len": N} or
// {"messages": [...], "output_len": N} lines. Lines without output_len get
// defaultOut. A shared prefix is prepended to prompts, and put before chat
// messages as a system message.
func loadDataset(path string, endpoint string, prefix string, defaultOut int) ([]promptSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseDataset(f, path, endpoint, prefix, defaultOut)
}

func parseDataset(r io.Reader, name, endpoint, prefix string, defaultOut int) ([]promptSpec, error) {
	var out []promptSpec
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 64*1024*1024)
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		var d datasetLine
		if err := json.Unmarshal(line, &d); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", name, n, err)
		}
		p := promptSpec{outputLen: defaultOut}
		if d.OutputLen != nil {
			p.outputLen = *d.OutputLen
		}
		switch {
		case d.Prompt != nil:
			p.prompt = *d.Prompt
			if prefix != "" {
				p.prompt = prefix + " " + p.prompt
			}
			p.inputEst = len(strings.Fields(p.prompt))
		case len(d.Messages) > 0:
			if endpoint != "chat" {
				return nil, fmt.Errorf("%s:%d: chat messages need --endpoint chat", name, n)
			}
			var msgs []json.RawMessage
			if err := json.Unmarshal(d.Messages, &msgs); err != nil || len(msgs) == 0 {
				return nil, fmt.Errorf("%s:%d: messages must be a non-empty array", name, n)
			}
			if prefix != "" {
				sys, _ := json.Marshal(map[string]string{"role": "system", "content": prefix})
				msgs = append([]json.RawMessage{sys}, msgs...)
			}
			p.messages, _ = json.Marshal(msgs)
			p.inputEst = len(strings.Fields(string(p.messages))) // rough
		default:
			return nil, fmt.Errorf(`%s:%d: need "prompt" or "messages"`, name, n)
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no prompts", name)
	}
	return out, nil
}

// takePrompts returns n prompts from src, cycling; n <= 0 means all of src.
func takePrompts(src []promptSpec, n int) []promptSpec {
	if n <= 0 {
		return src
	}
	out := make([]promptSpec, n)
	for i := range out {
		out[i] = src[i%len(src)]
	}
	return out
}

// requestBody is the JSON body for one prompt; fields in JSON order of interest.
type requestBody struct {
	Model         string          `json:"model"`
	Messages      json.RawMessage `json:"messages,omitempty"`
	Prompt        string          `json:"prompt,omitempty"`
	MaxTokens     int             `json:"max_tokens,omitempty"`
	IgnoreEOS     bool            `json:"ignore_eos,omitempty"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options,omitempty"`
}

// embeddingBody is an embeddings request.
type embeddingBody struct {
	Model          string `json:"model"`
	Input          string `json:"input"`
	EncodingFormat string `json:"encoding_format"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// buildBody marshals one request body ahead of the run.
func buildBody(p promptSpec, model, endpoint string, stream, usage, ignoreEOS bool) []byte {
	if endpoint == "embeddings" {
		// What the official SDKs send by default: base64.
		b, _ := json.Marshal(embeddingBody{Model: model, Input: p.prompt, EncodingFormat: "base64"})
		return b
	}
	rb := requestBody{Model: model, MaxTokens: p.outputLen, Stream: stream}
	if p.outputLen > 0 {
		rb.IgnoreEOS = ignoreEOS
	}
	if stream && usage {
		rb.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if endpoint == "chat" {
		if p.messages != nil {
			rb.Messages = p.messages
		} else {
			rb.Messages, _ = json.Marshal([]chatMessage{{Role: "user", Content: p.prompt}})
		}
	} else {
		rb.Prompt = p.prompt
	}
	b, _ := json.Marshal(rb)
	return b
}
