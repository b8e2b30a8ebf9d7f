// The load client of the protocol workloads, where wrk and h2load have no mode for it. It prints
// one JSON object.
//
//	load ws  -url ws://127.0.0.1:PORT/ws -c 64 -d 2s -size 32
//	    each connection keeps one text message in flight (no pipelining): send, read the echo,
//	    check it byte for byte, send the next; round trips, and their latency percentiles.
//	load tls -addr 127.0.0.1:PORT -c 16 -d 2s [-resume]
//	    new TLS connections, each: handshake, one GET /plaintext with Connection: close, read to
//	    the end; with -resume the client keeps a session cache, so that after the first
//	    handshake the others resume (TLS 1.3 tickets, which arrive after the handshake: hence
//	    the request).
package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

type result struct {
	Mode       string  `json:"mode"`
	Count      int64   `json:"count"`
	Errors     int64   `json:"errors"`
	Mismatches int64   `json:"mismatches,omitempty"`
	Stalled    int     `json:"stalled_connections"`
	MinPerConn int64   `json:"min_per_connection"`
	MaxPerConn int64   `json:"max_per_connection"`
	Resumed    int64   `json:"resumed,omitempty"`
	ElapsedS   float64 `json:"elapsed_s"`
	Rate       float64 `json:"per_s"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	Version    string  `json:"tls_version,omitempty"`
	Cipher     string  `json:"cipher,omitempty"`
	FirstError string  `json:"first_error,omitempty"`
}

type worker struct {
	count, errors, mismatches, resumed int64
	lat                                []time.Duration
	firstErr                           error
	late                               bool // its first round trip ended after the cell
	version, cipher                    uint16
}

func percentile(all []time.Duration, q float64) float64 {
	if len(all) == 0 {
		return 0
	}
	i := int(q * float64(len(all)))
	if i >= len(all) {
		i = len(all) - 1
	}
	return float64(all[i]) / 1e6
}

func wsConn(url string, size int, end time.Time, w *worker) {
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, ReadBufferSize: 4096, WriteBufferSize: 4096}
	c, _, err := d.Dial(url, http.Header{})
	if err != nil {
		w.errors++
		w.firstErr = err
		return
	}
	defer c.Close()
	msg := make([]byte, size)
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	for i := range msg {
		msg[i] = alphabet[rand.Intn(len(alphabet))]
	}
	// A message still unanswered one second after the end is an error (the connection stalled).
	c.SetReadDeadline(end.Add(time.Second))
	for time.Now().Before(end) {
		t0 := time.Now()
		if err := c.WriteMessage(websocket.TextMessage, msg); err != nil {
			w.errors++
			w.firstErr = err
			return
		}
		kind, got, err := c.ReadMessage()
		if err != nil {
			w.errors++
			w.firstErr = err
			return
		}
		w.lat = append(w.lat, time.Since(t0))
		w.count++
		if w.count == 1 && time.Now().After(end) {
			w.late = true
		}
		if kind != websocket.TextMessage || !bytes.Equal(got, msg) {
			w.mismatches++
		}
		msg[w.count%int64(size)] = alphabet[w.count%int64(len(alphabet))]
	}
	c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(1000, ""), time.Now().Add(time.Second))
}

func tlsConns(addr string, resume bool, end time.Time, w *worker) {
	cfg := &tls.Config{
		InsecureSkipVerify: true, // the suite's self-signed certificate
		NextProtos:         []string{"http/1.1"},
		// X25519 alone, as OpenSSL 3.0's clients (wrk, h2load) offer: Go would also offer a
		// post-quantum share that the OpenSSL servers do not take.
		CurvePreferences: []tls.CurveID{tls.X25519},
	}
	if resume {
		cfg.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	}
	host, _, _ := net.SplitHostPort(addr)
	req := []byte("GET /plaintext HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n")
	for time.Now().Before(end) {
		t0 := time.Now()
		raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			w.errors++
			w.firstErr = err
			time.Sleep(10 * time.Millisecond)
			continue
		}
		raw.SetDeadline(time.Now().Add(5 * time.Second))
		c := tls.Client(raw, cfg)
		err = c.Handshake()
		if err == nil {
			_, err = c.Write(req)
		}
		var body []byte
		if err == nil {
			body, err = io.ReadAll(c)
		}
		st := c.ConnectionState()
		c.Close()
		if err != nil || !bytes.Contains(body, []byte("Hello, World!")) {
			w.errors++
			if err == nil {
				err = fmt.Errorf("answer %q", body)
			}
			w.firstErr = err
			continue
		}
		w.count++
		w.lat = append(w.lat, time.Since(t0))
		w.version, w.cipher = st.Version, st.CipherSuite
		if st.DidResume {
			w.resumed++
		}
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: load ws|tls [flags]")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	url := fs.String("url", "", "ws: the WebSocket URL")
	addr := fs.String("addr", "", "tls: host:port")
	conns := fs.Int("c", 64, "connections (ws) or concurrent connectors (tls)")
	dur := fs.Duration("d", 2*time.Second, "duration")
	size := fs.Int("size", 32, "ws: message size in bytes")
	resume := fs.Bool("resume", false, "tls: resume sessions")
	fs.Parse(os.Args[2:])

	workers := make([]*worker, *conns)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(*dur)
	for i := range workers {
		workers[i] = &worker{}
		wg.Add(1)
		go func(w *worker) {
			defer wg.Done()
			switch mode {
			case "ws":
				wsConn(*url, *size, end, w)
			case "tls":
				tlsConns(*addr, *resume, end, w)
			}
		}(workers[i])
	}
	wg.Wait()
	elapsed := time.Since(start)
	if elapsed < *dur {
		elapsed = *dur
	}
	res := result{Mode: mode, ElapsedS: elapsed.Seconds()}
	var all []time.Duration
	res.MinPerConn = -1
	for _, w := range workers {
		if res.MinPerConn < 0 || w.count < res.MinPerConn {
			res.MinPerConn = w.count
		}
		if w.count > res.MaxPerConn {
			res.MaxPerConn = w.count
		}
		res.Count += w.count
		res.Errors += w.errors
		res.Mismatches += w.mismatches
		res.Resumed += w.resumed
		// A connection the server left unanswered for the whole cell: none of its round trips
		// ended in time (its first may still have come back in the grace second).
		if w.count == 0 || w.late {
			res.Stalled++
		}
		if w.firstErr != nil && res.FirstError == "" {
			res.FirstError = w.firstErr.Error()
		}
		if w.cipher != 0 {
			res.Version = tls.VersionName(w.version)
			res.Cipher = tls.CipherSuiteName(w.cipher)
		}
		all = append(all, w.lat...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	// The rate is over the nominal duration: a connection's last round trip may end a little
	// after it, the server's CPU time is read over the same span.
	res.Rate = float64(res.Count) / dur.Seconds()
	res.P50ms = percentile(all, 0.50)
	res.P99ms = percentile(all, 0.99)
	json.NewEncoder(os.Stdout).Encode(res)
}
