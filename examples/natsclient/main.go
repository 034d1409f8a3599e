package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/schemas"
)

func main() {
	url := flag.String("nats", nats.DefaultURL, "NATS server")
	model := flag.String("model", "llama-8b", "model")
	maxTokens := flag.Int("max-tokens", 64, "max_tokens")
	flag.Parse()
	prompt := strings.Join(flag.Args(), " ")
	if prompt == "" {
		prompt = "Hello!"
	}
	if err := run(*url, *model, prompt, *maxTokens); err != nil {
		fmt.Fprintln(os.Stderr, "natsclient:", err)
		os.Exit(1)
	}
}

func run(url, model, prompt string, maxTokens int) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	cl, err := client.New(nc, client.Options{})
	if err != nil {
		return err
	}
	defer cl.Close()
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := cl.Start(&client.Request{ID: "natsclient-" + nuid.Next(), Kind: schemas.KindChat, Model: model,
		Body: body, Deadline: time.Now().Add(2 * time.Minute)})
	if err != nil {
		return err
	}
	defer st.Close()
	for {
		f, err := st.Next(ctx)
		if err != nil {
			return err
		}
		if f.Type == schemas.FrameDone {
			fmt.Printf("\n[done on worker %s: %s]\n", st.Worker(), f.Payload)
			return nil
		}
		_ = schemas.ForEachLine(f.Payload, func(line []byte) error {
			var c struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal(line, &c) == nil && len(c.Choices) > 0 {
				fmt.Print(c.Choices[0].Delta.Content)
			}
			return nil
		})
	}
}
