// The Go peer of the protocol workloads: net/http serving /plaintext over HTTP/1.1, HTTPS,
// HTTP/2 (by ALPN over TLS, or cleartext with prior knowledge) and a WebSocket echo on /ws
// (gorilla/websocket).
//
// Usage: server -addr 127.0.0.1:PORT -threads N [-cert FILE -key FILE] [-h2c]
package main

import (
	"flag"
	"log"
	"net/http"
	"runtime"

	"github.com/gorilla/websocket"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	threads := flag.Int("threads", 1, "GOMAXPROCS: the OS threads running Go code")
	cert := flag.String("cert", "", "certificate (PEM): serve HTTPS, HTTP/2 by ALPN")
	key := flag.String("key", "", "private key (PEM)")
	h2c := flag.Bool("h2c", false, "cleartext: also HTTP/2 with prior knowledge")
	flag.Parse()
	runtime.GOMAXPROCS(*threads)

	body := []byte("Hello, World!")
	up := websocket.Upgrader{
		ReadBufferSize:  4096,
		WriteBufferSize: 4096,
		// The load client sends no Origin; a browser's would be checked here.
		CheckOrigin: func(r *http.Request) bool { return true },
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/plaintext", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write(body)
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			kind, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			if err := c.WriteMessage(kind, msg); err != nil {
				return
			}
		}
	})
	srv := &http.Server{Addr: *addr, Handler: mux}
	if *cert != "" {
		log.Fatal(srv.ListenAndServeTLS(*cert, *key))
	}
	if *h2c {
		p := new(http.Protocols)
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		srv.Protocols = p
	}
	log.Fatal(srv.ListenAndServe())
}
