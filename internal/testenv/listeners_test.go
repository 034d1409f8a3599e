package testenv

import (
	"errors"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

func TestResetListener(t *testing.T) {
	l := ResetListener(t)
	c := &http.Client{Timeout: 5 * time.Second}
	start := time.Now()
	_, err := c.Get("http://" + l.Addr + "/")
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("GET: %v, want a reset", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the reset took %s", d)
	}
	if l.Accepted() == 0 {
		t.Error("Accepted() = 0 after a request")
	}
}

func TestSilentListener(t *testing.T) {
	l := SilentListener(t)
	c, err := net.DialTimeout("tcp", l.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes, %v: want silence until the deadline", n, err)
	}
	WaitFor(t, 5*time.Second, func() error {
		if l.Accepted() != 1 {
			return errors.New("the connection was not counted")
		}
		return nil
	})
}
