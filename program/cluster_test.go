package program

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// natsCluster starts n NATS servers in this process, joined by routes, on
// ports chosen at run time; they stop with the test.
func natsCluster(t *testing.T, n int) []*server.Server {
	t.Helper()
	var nodes []*server.Server
	start := func(i int, routes string) *server.Server {
		o := &server.Options{ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: "tb", Host: "127.0.0.1", Port: -1}}
		if routes != "" {
			o.Routes = server.RoutesFromStr(routes)
		}
		ns, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		ns.Start()
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatalf("node %d did not start", i+1)
		}
		return ns
	}
	first := start(0, "")
	nodes = append(nodes, first)
	seed := fmt.Sprintf("nats-route://%s", first.ClusterAddr())
	for i := 1; i < n; i++ {
		nodes = append(nodes, start(i, seed))
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		for _, ns := range nodes {
			if ns.NumRoutes() < n-1 {
				return fmt.Errorf("%s has %d routes, want %d", ns.Name(), ns.NumRoutes(), n-1)
			}
		}
		return nil
	})
	return nodes
}

// urls lists the nodes' client URLs, first first, comma-separated.
func urls(nodes []*server.Server, first int) string {
	var u []string
	for i := range nodes {
		u = append(u, nodes[(first+i)%len(nodes)].ClientURL())
	}
	return strings.Join(u, ",")
}

// nodeOf is the index of the node a connection's URL names.
func nodeOf(nodes []*server.Server, url string) int {
	for i, ns := range nodes {
		if ns.ClientURL() == url {
			return i
		}
	}
	return -1
}

// streamEnd is how one stream of a chaos test ended.
type streamEnd struct {
	tokens int    // completion tokens the usage chunk counted (0 if none came)
	code   string // the error event's code, "" if none
	at     time.Time
}

// checkStreamEnds reads the ends of n streams of 300 tokens: none may hang,
// none may fail, and a failed one must have ended with an OpenAI error event
// within 3s of the fault (at, described by what).
func checkStreamEnds(t *testing.T, ends <-chan streamEnd, n int, at time.Time, what string) {
	t.Helper()
	failed, slowest, codes := 0, time.Duration(0), map[string]int{}
	for range n {
		var e streamEnd
		select {
		case e = <-ends:
		case <-time.After(30 * time.Second):
			t.Fatalf("a stream still runs 30s after %s", what)
		}
		if e.code == "" && e.tokens == 300 {
			continue
		}
		failed++
		codes[e.code]++
		slowest = max(slowest, e.at.Sub(at))
		if e.code == "" || strings.HasPrefix(e.code, "status") || strings.HasPrefix(e.code, "http") || e.code == "malformed event" {
			t.Errorf("a stream ended with %d tokens and %q: not an OpenAI error event", e.tokens, e.code)
		}
	}
	t.Logf("%d of %d streams failed (%v), the last %v after %s", failed, n, codes, slowest, what)
	if slowest > 3*time.Second {
		t.Errorf("a failed stream ended %v after %s, want ≤ 3s", slowest, what)
	}
	if failed > 0 {
		t.Errorf("%d streams failed, want 0", failed)
	}
}

// runStream posts a streaming chat request for n tokens, signals started
// when its first chunk is in, and reports how it ended.
func runStream(ctx context.Context, addr string, n int, started func()) streamEnd {
	body := fmt.Sprintf(`{"model":"llama-8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`, n)
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		started()
		return streamEnd{code: "http: " + err.Error(), at: time.Now()}
	}
	defer resp.Body.Close()
	var end streamEnd
	first := true
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || !strings.HasPrefix(data, "{") {
			continue
		}
		if first {
			first = false
			started()
		}
		var ev struct {
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &ev) != nil {
			end.code = "malformed event"
			continue
		}
		if ev.Error != nil {
			end.code = ev.Error.Code
			if end.code == "" {
				end.code = "error without a code"
			}
		}
		if ev.Usage != nil {
			end.tokens = ev.Usage.CompletionTokens
		}
	}
	if first {
		started()
		if resp.StatusCode != 200 {
			end.code = fmt.Sprintf("status %d", resp.StatusCode)
		}
	}
	end.at = time.Now()
	return end
}

// A NATS node fails under 30 streams. Gateway, dispatcher and worker list
// every node and reconnect to another. No stream fails (streams whose
// frames the node took with it migrate); and were one to fail, it would end
// with an OpenAI error event with a code within 3s of the fault, not hang.
func TestNATSNodeLossUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: a 3-node cluster")
	}
	t.Parallel() // its own servers and ports; mostly waiting
	for _, victim := range []string{"worker's node", "gateway's node"} {
		t.Run(victim, func(t *testing.T) {
			nodes := natsCluster(t, 3)
			wc := DefaultWorker()
			wc.NATS.URL, wc.Worker.ID = urls(nodes, 0), "w1"
			w, err := StartWorker(context.Background(), wc)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = w.Close() })
			dc := DefaultDispatcher()
			dc.NATS.URL, dc.Redis.URL = urls(nodes, 1), ""
			d, err := StartDispatcher(context.Background(), dc)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			gw := plainGateway(t, nodes[0], func(c *GatewayConfig) { c.NATS.URL = urls(nodes, 2) })
			testenv.WaitFor(t, 10*time.Second, fleetLen(gw, 1))
			kill := nodeOf(nodes, w.run().nc.ConnectedUrl())
			if victim == "gateway's node" {
				kill = nodeOf(nodes, gw.run().nc.ConnectedUrl())
			}
			t.Logf("worker on n%d, gateway on n%d; stopping n%d", nodeOf(nodes, w.run().nc.ConnectedUrl())+1,
				nodeOf(nodes, gw.run().nc.ConnectedUrl())+1, kill+1)

			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const n = 30
			var started sync.WaitGroup
			started.Add(n)
			ends := make(chan streamEnd, n)
			for range n {
				go func() { ends <- runStream(ctx, gw.Addr(), 300, started.Done) }()
			}
			started.Wait()
			killed := time.Now()
			nodes[kill].Shutdown()

			checkStreamEnds(t, ends, n, killed, "the node stopped")
		})
	}
}

// The only NATS server restarts (same port) under 20 streams: each stream
// either completes or ends with an OpenAI error event within 3s of the
// server's return; none hangs; and none fails.
func TestNATSRestartUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: a NATS restart")
	}
	t.Parallel() // its own servers and ports; ~20 s of its programs' closing after the restart, waited beside other tests
	port, dir := testenv.FreePort(t), t.TempDir()
	ns := natsOn(t, port, dir)
	simWorker(t, ns, "w1")
	gw := plainGateway(t, ns)
	testenv.WaitFor(t, 10*time.Second, fleetLen(gw, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 20
	var started sync.WaitGroup
	started.Add(n)
	ends := make(chan streamEnd, n)
	for range n {
		go func() { ends <- runStream(ctx, gw.Addr(), 300, started.Done) }()
	}
	started.Wait()
	ns.Shutdown()
	ns.WaitForShutdown()
	natsOn(t, port, dir)
	back := time.Now()
	checkStreamEnds(t, ends, n, back, "NATS came back")
}
