package integration

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// blackhole is a TCP proxy between the runtime and a broker that can turn
// into a half-open connection: it keeps every connection open and silently
// drops the bytes, in one direction or both. Neither end sees an error or
// a close; what was written "succeeded" and never arrives, as across a
// network partition or a dead NAT entry.
type blackhole struct {
	ln     net.Listener
	target string
	// up drops what the client (the runtime) sends; down what the broker
	// sends back.
	up, down atomic.Bool
	mu       sync.Mutex
	conns    []net.Conn
	closed   bool
	// dropped counts the bytes swallowed from the client.
	dropped atomic.Int64
}

// newBlackhole listens on loopback and forwards to target until closed at
// the end of the test.
func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	go b.serve()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) addr() string { return b.ln.Addr().String() }

// dropFromClient swallows what the runtime sends from now on (acks, pull
// requests, PINGs); the broker's deliveries still arrive.
func (b *blackhole) dropFromClient() { b.up.Store(true) }

// dropBoth swallows everything both ways.
func (b *blackhole) dropBoth() { b.up.Store(true); b.down.Store(true) }

// cut closes every connection (the partition ends the way a dead peer is
// finally noticed) and lets new ones through.
func (b *blackhole) cut() {
	b.mu.Lock()
	conns := b.conns
	b.conns = nil
	b.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	b.up.Store(false)
	b.down.Store(false)
}

func (b *blackhole) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	_ = b.ln.Close()
	b.cut()
}

func (b *blackhole) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", b.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		b.conns = append(b.conns, c, s)
		b.mu.Unlock()
		go b.pipe(s, c, &b.up, true)
		go b.pipe(c, s, &b.down, false)
	}
}

// pipe copies src to dst, discarding while drop is set.
func (b *blackhole) pipe(dst io.WriteCloser, src io.ReadCloser, drop *atomic.Bool, fromClient bool) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if drop.Load() {
				if fromClient {
					b.dropped.Add(int64(n))
				}
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
