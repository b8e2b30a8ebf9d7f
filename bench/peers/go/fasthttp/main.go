// The valyala/fasthttp peer (seeds 000 and 003): every workload route, dispatched on the path.
// Usage: fasthttp -addr 127.0.0.1:PORT -threads N -data bench/data
package main

import (
	"flag"
	"log"
	"runtime"

	"github.com/valyala/fasthttp"

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
	handler := func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/plain")
		var body []byte
		var err error
		switch string(ctx.Path()) {
		case "/plaintext":
			body = []byte("Hello, World!")
		case "/welcome":
			body = []byte("Welcome!\n")
		case "/fib":
			body = workload.FibBody()
		case "/loop":
			body = workload.LoopBody()
		case "/msgpack":
			body, err = d.MsgpackBody()
		case "/json":
			body, err = d.JSONBody()
		case "/transfer":
			ctx.SetContentType("application/json")
			body = d.Transfer
		default:
			ctx.Error("not found\n", fasthttp.StatusNotFound)
			return
		}
		if err != nil {
			ctx.Error(err.Error(), fasthttp.StatusInternalServerError)
			return
		}
		ctx.SetBody(body)
	}
	s := &fasthttp.Server{Handler: handler, Name: "fasthttp"}
	log.Fatal(s.ListenAndServe(*addr))
}
