module cyserve.local/bench/peers/goproto

go 1.24

require github.com/gorilla/websocket v1.5.3
