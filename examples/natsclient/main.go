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
	user := flag.String("user", "", "NATS user (a tenant's, from tokenbus nats-users)")
	password := flag.String("password", os.Getenv("NATS_PASSWORD"), "NATS password (default $NATS_PASSWORD)")
	keyID := flag.String("key-id", "", "as a tenant: your API key's id (requests go on tokenbus.v1.treq.<key-id>.<model>)")
	tenant := flag.String("tenant", "", "as a tenant: your tenant name (replies come under its inbox, _INBOX.<tenant>)")
	flag.Parse()
	prompt := strings.Join(flag.Args(), " ")
	if prompt == "" {
		prompt = "Hello!"
	}
	opts := []nats.Option{}
	if *user != "" {
		opts = append(opts, nats.UserInfo(*user, *password))
	}
	if *tenant != "" {
		opts = append(opts, nats.CustomInboxPrefix(schemas.TenantInbox(*tenant)))
	}
	if err := run(*url, *model, prompt, *maxTokens, *keyID, opts...); err != nil {
		fmt.Fprintln(os.Stderr, "natsclient:", err)
		os.Exit(1)
	}
}

func run(url, model, prompt string, maxTokens int, keyID string, opts ...nats.Option) error {
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	cl, err := client.New(nc, client.Options{KeyID: keyID})
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
