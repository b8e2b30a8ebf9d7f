// The Go net/http peer: every workload route on the standard library's server.
// Usage: nethttp -addr 127.0.0.1:PORT -threads N -data bench/data
package main

import (
	"flag"
	"log"
	"net/http"
	"runtime"

	"cyserve.local/bench/peers/workload"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	threads := flag.Int("threads", 1, "GOMAXPROCS: the OS threads running Go code")
	dataDir := flag.String("data", "bench/data", "folder holding records.msgpack and transfer.json")
	flag.Parse()
	runtime.GOMAXPROCS(*threads)
	d, err := workload.Load(*dataDir)
	if err != nil {
		log.Fatal(err)
	}
	text := func(w http.ResponseWriter, body []byte) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write(body)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/plaintext", func(w http.ResponseWriter, r *http.Request) {
		text(w, []byte("Hello, World!"))
	})
	mux.HandleFunc("/welcome", func(w http.ResponseWriter, r *http.Request) {
		text(w, []byte("Welcome!\n"))
	})
	mux.HandleFunc("/fib", func(w http.ResponseWriter, r *http.Request) {
		text(w, workload.FibBody())
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) {
		text(w, workload.LoopBody())
	})
	mux.HandleFunc("/msgpack", func(w http.ResponseWriter, r *http.Request) {
		b, err := d.MsgpackBody()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		text(w, b)
	})
	mux.HandleFunc("/json", func(w http.ResponseWriter, r *http.Request) {
		b, err := d.JSONBody()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		text(w, b)
	})
	mux.HandleFunc("/transfer", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(d.Transfer)
	})
	log.Fatal(http.ListenAndServe(*addr, mux))
}
