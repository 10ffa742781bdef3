package integration

import (
	"bytes"
	"encoding/binary"
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
	// trigger, when set, turns the proxy half-open at the first chunk from
	// the client it matches (that chunk is swallowed too); fired says it
	// did. It makes one matcher per connection (a matcher may keep state,
	// e.g. Kafka's request framing).
	trigger atomic.Pointer[func() func([]byte) bool]
	fired   chan struct{}
	once    sync.Once
}

// newBlackhole listens on loopback and forwards to target until closed at
// the end of the test.
func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target, fired: make(chan struct{})}
	go b.serve()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) addr() string { return b.ln.Addr().String() }

// halfOpenAt turns the proxy half-open (both ways) at the first chunk the
// runtime sends that match reports: the first acknowledgement, so every
// acknowledgement is lost while the deliveries before it arrived.
func (b *blackhole) halfOpenAt(matcher func() func([]byte) bool) { b.trigger.Store(&matcher) }

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
	b.trigger.Store(nil)
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

// setTarget is for a broker that must advertise the proxy's address
// (kfake): it is listened on after the proxy.
func (b *blackhole) setTarget(target string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.target = target
}

func (b *blackhole) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		target := b.target
		b.mu.Unlock()
		s, err := net.Dial("tcp", target)
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
	var match func([]byte) bool
	for {
		n, err := src.Read(buf)
		if n > 0 && fromClient {
			if m := b.trigger.Load(); m != nil && match == nil {
				match = (*m)()
			}
			if match != nil && match(buf[:n]) {
				b.dropBoth()
				b.once.Do(func() { close(b.fired) })
			}
		}
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

// Matchers of each protocol's acknowledgement, as the runtime writes it,
// one per connection.
var (
	// NATS: "PUB $JS.ACK.<stream>.<consumer>...".
	natsAck = contains([]byte("$JS.ACK."))
	// AMQP 0-9-1: a method frame of basic.ack (class 60, method 80).
	amqpAck = contains([]byte{0x00, 0x3c, 0x00, 0x50})
	// RESP: go-redis writes command names in lower case.
	redisAck = contains([]byte("\r\n$4\r\nxack\r\n"))
)

// contains matches pattern anywhere in the connection's bytes, also across
// two reads.
func contains(pattern []byte) func() func([]byte) bool {
	return func() func([]byte) bool {
		var tail []byte
		return func(p []byte) bool {
			joined := append(tail, p...)
			found := bytes.Contains(bytes.ToLower(joined), bytes.ToLower(pattern))
			if keep := len(pattern) - 1; len(joined) > keep {
				tail = append([]byte(nil), joined[len(joined)-keep:]...)
			} else {
				tail = joined
			}
			return found
		}
	}
}

// kafkaAck matches an OffsetCommit request (API key 8): it follows the
// client's request framing (size int32, then api_key int16) across reads.
func kafkaAck() func([]byte) bool {
	var pending []byte
	return func(p []byte) bool {
		pending = append(pending, p...)
		for len(pending) >= 6 {
			if binary.BigEndian.Uint16(pending[4:]) == 8 {
				return true
			}
			size := int(binary.BigEndian.Uint32(pending))
			if 4+size > len(pending) {
				break
			}
			pending = pending[4+size:]
		}
		return false
	}
}

// addrListener is a listener that reports another address: kfake
// advertises its listener's address to clients, and this makes it the
// proxy's.
type addrListener struct {
	net.Listener
	addr net.Addr
}

func (l addrListener) Addr() net.Addr { return l.addr }
