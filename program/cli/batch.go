package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/internal/flagenv"
)

// tokenbus batch submit FILE.jsonl: upload a file, start a batch on it and,
// with --wait, follow it with a progress line and write its output file.
// It speaks the OpenAI API over HTTP, to tokenbus or any server that has it.

type batchOptions struct {
	url, apiKey, model, endpoint, output string
	wait                                 bool
	poll                                 time.Duration
}

func runBatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("batch submit FILE.jsonl")
	o := batchOptions{url: "http://127.0.0.1:8080", endpoint: "/v1/chat/completions", poll: time.Second}
	fs.StringVar(&o.url, "url", o.url, "the OpenAI API's base URL (without /v1)")
	fs.StringVar(&o.apiKey, "api-key", o.apiKey, "API key, sent as Authorization: Bearer (prefer the environment variable)")
	fs.StringVar(&o.model, "model", o.model, "model of every line whose body names none")
	fs.StringVar(&o.endpoint, "endpoint", o.endpoint, "endpoint of the batch: /v1/chat/completions or /v1/completions")
	fs.BoolVar(&o.wait, "wait", o.wait, "follow the batch to its end with a progress line, then write its output (and error) file")
	fs.StringVar(&o.output, "output", o.output, `where --wait writes the output file ("": FILE with .output.jsonl; errors go beside it as .errors.jsonl)`)
	fs.DurationVar(&o.poll, "poll", o.poll, "how often --wait asks for the batch's progress")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) != 2 || rest[0] != "submit" {
		return errors.New("usage: tokenbus batch submit FILE.jsonl [flags]")
	}
	path := rest[1]
	if o.output == "" {
		o.output = strings.TrimSuffix(path, ".jsonl") + ".output.jsonl"
	}
	c := &apiClient{base: strings.TrimSuffix(o.url, "/"), key: o.apiKey}
	fileID, err := c.upload(ctx, path, o)
	if err != nil {
		return err
	}
	var b batchView
	body, _ := json.Marshal(map[string]string{"input_file_id": fileID, "endpoint": o.endpoint, "completion_window": "24h"})
	if err := c.call(ctx, "POST", "/v1/batches", bytes.NewReader(body), &b); err != nil {
		return fmt.Errorf("create the batch: %w", err)
	}
	fmt.Fprintf(stdout, "batch %s created on file %s (%s)\n", b.ID, fileID, b.Status)
	if !o.wait {
		return nil
	}
	return followBatch(ctx, c, b.ID, o, stdout)
}

// batchView is what the command reads of a batch.
type batchView struct {
	ID            string  `json:"id"`
	Status        string  `json:"status"`
	OutputFileID  *string `json:"output_file_id"`
	ErrorFileID   *string `json:"error_file_id"`
	RequestCounts struct {
		Total     int `json:"total"`
		Completed int `json:"completed"`
		Failed    int `json:"failed"`
	} `json:"request_counts"`
	Errors *struct {
		Data []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Line    *int   `json:"line"`
		} `json:"data"`
	} `json:"errors"`
}

// followBatch polls until the batch ends, drawing a progress line, then
// writes its files.
func followBatch(ctx context.Context, c *apiClient, id string, o batchOptions, stdout io.Writer) error {
	t := time.NewTicker(o.poll)
	defer t.Stop()
	start := time.Now()
	var b batchView
	for {
		if err := c.call(ctx, "GET", "/v1/batches/"+id, nil, &b); err != nil {
			fmt.Fprintf(stdout, "\r%s: %v (retrying)", id, err)
		} else {
			fmt.Fprint(stdout, "\r"+progressLine(b, time.Since(start)))
			switch b.Status {
			case "completed", "failed", "expired", "cancelled":
				fmt.Fprintln(stdout)
				return finishBatch(ctx, c, b, o, stdout)
			}
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(stdout)
			return ctx.Err()
		case <-t.C:
		}
	}
}

// progressLine is one line of progress: a bar, lines done, rate and ETA.
func progressLine(b batchView, took time.Duration) string {
	rc := b.RequestCounts
	done := rc.Completed + rc.Failed
	const width = 30
	filled := 0
	if rc.Total > 0 {
		filled = width * done / rc.Total
	}
	line := fmt.Sprintf("%-12s [%s%s] %d/%d lines", b.Status, strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, rc.Total)
	if rc.Failed > 0 {
		line += fmt.Sprintf(" (%d failed)", rc.Failed)
	}
	if s := took.Seconds(); done > 0 && s > 0 {
		rate := float64(done) / s
		line += fmt.Sprintf("  %.1f lines/s", rate)
		if left := rc.Total - done; left > 0 {
			line += "  ETA " + time.Duration(float64(left)/rate*float64(time.Second)).Round(time.Second).String()
		}
	}
	return line + "   " // covers what a longer earlier line left
}

// finishBatch writes a finished batch's files and reports how it ended.
func finishBatch(ctx context.Context, c *apiClient, b batchView, o batchOptions, stdout io.Writer) error {
	if b.Status == "failed" {
		if b.Errors != nil {
			for _, e := range b.Errors.Data {
				at := ""
				if e.Line != nil {
					at = fmt.Sprintf("line %d: ", *e.Line)
				}
				fmt.Fprintf(stdout, "  %s%s (%s)\n", at, e.Message, e.Code)
			}
		}
		return fmt.Errorf("batch %s failed validation", b.ID)
	}
	for _, f := range []struct {
		id   *string
		path string
	}{{b.OutputFileID, o.output}, {b.ErrorFileID, strings.TrimSuffix(o.output, ".output.jsonl") + ".errors.jsonl"}} {
		if f.id == nil {
			continue
		}
		if err := c.download(ctx, *f.id, f.path); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", f.path)
	}
	if b.Status != "completed" {
		return fmt.Errorf("batch %s ended %s", b.ID, b.Status)
	}
	return nil
}

// apiClient calls the OpenAI API.
type apiClient struct {
	base, key string
}

func (c *apiClient) request(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

func (c *apiClient) do(req *http.Request, out any) error {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			return fmt.Errorf("%d: %s", resp.StatusCode, e.Error.Message)
		}
		return fmt.Errorf("%d: %.200s", resp.StatusCode, b)
	}
	return json.Unmarshal(b, out)
}

func (c *apiClient) call(ctx context.Context, method, path string, body io.Reader, out any) error {
	req, err := c.request(ctx, method, path, body)
	if err != nil {
		return err
	}
	return c.do(req, out)
}

// upload streams path to POST /v1/files as batch lines: a line that is a
// request body alone ({"messages":...}) gets a custom_id (line-N), the
// method and the url; --model fills a body that names no model.
func (c *apiClient) upload(ctx context.Context, path string, o batchOptions) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		err := mw.WriteField("purpose", "batch")
		var part io.Writer
		if err == nil {
			part, err = mw.CreateFormFile("file", baseName(path))
		}
		if err == nil {
			err = batchLines(f, part, o)
		}
		if err == nil {
			err = mw.Close()
		}
		_ = pw.CloseWithError(err)
	}()
	req, err := c.request(ctx, "POST", "/v1/files", pr)
	if err != nil {
		_ = pr.Close()
		return "", err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	var out struct {
		ID string `json:"id"`
	}
	if err := c.do(req, &out); err != nil {
		return "", fmt.Errorf("upload %s: %w", path, err)
	}
	return out.ID, nil
}

// batchLines copies r's lines to w as batch input lines (see upload).
func batchLines(r io.Reader, w io.Writer, o batchOptions) error {
	br := bufio.NewReaderSize(r, 1<<20)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			out, werr := batchLine(n, bytes.TrimSpace(line), o)
			if werr != nil {
				return fmt.Errorf("line %d: %w", n, werr)
			}
			if _, werr := w.Write(append(out, '\n')); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func batchLine(n int, line []byte, o batchOptions) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil {
		return nil, errors.New("not a JSON object")
	}
	body := obj
	wrapped := obj["body"] == nil
	if !wrapped {
		if err := json.Unmarshal(obj["body"], &body); err != nil {
			return nil, errors.New("body is not a JSON object")
		}
	}
	if _, ok := body["model"]; !ok && o.model != "" {
		body["model"], _ = json.Marshal(o.model)
	}
	b, _ := json.Marshal(body)
	if wrapped {
		obj = map[string]json.RawMessage{}
		obj["custom_id"], _ = json.Marshal(fmt.Sprintf("line-%d", n))
		obj["method"], _ = json.Marshal("POST")
		obj["url"], _ = json.Marshal(o.endpoint)
	}
	obj["body"] = b
	return json.Marshal(obj)
}

// download writes file id's content to path.
func (c *apiClient) download(ctx context.Context, id, path string) error {
	req, err := c.request(ctx, "GET", "/v1/files/"+id+"/content", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("download %s: %d", id, resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func baseName(path string) string {
	if i := strings.LastIndexAny(path, `/\`); i >= 0 {
		return path[i+1:]
	}
	return path
}
