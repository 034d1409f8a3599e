package runners

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRunsEveryFunction(t *testing.T) {
	r := New(time.Minute)
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[int]bool{}
	for i := range 1000 {
		wg.Add(1)
		r.Go(func() {
			defer wg.Done()
			mu.Lock()
			seen[i] = true
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(seen) != 1000 {
		t.Fatalf("%d of 1000 functions ran", len(seen))
	}
}

func TestReusesIdleGoroutine(t *testing.T) {
	// Functions run one after another take the same goroutine (its id, from
	// its stack trace's first line, stays the same).
	r := New(time.Minute)
	ids := map[string]bool{}
	for range 100 {
		got := make(chan string)
		r.Go(func() {
			buf := make([]byte, 64)
			got <- strings.Fields(string(buf[:runtime.Stack(buf, false)]))[1]
		})
		ids[<-got] = true
		// Room for the goroutine to wait for work again; were it still
		// busy, Go would start another (correct, but not what is tested).
		time.Sleep(time.Millisecond)
	}
	if len(ids) > 3 {
		t.Fatalf("%d goroutines for 100 functions run one at a time", len(ids))
	}
}

func TestIdleGoroutinesEnd(t *testing.T) {
	r := New(20 * time.Millisecond)
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		r.Go(func() { time.Sleep(10 * time.Millisecond); wg.Done() })
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine() - before; n > 0 {
		t.Fatalf("%d goroutines still there after their idle time", n)
	}
}
