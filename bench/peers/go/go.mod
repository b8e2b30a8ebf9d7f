module cyserve.local/bench/peers

go 1.23.0

require (
	github.com/valyala/fasthttp v1.62.0
	github.com/vmihailenco/msgpack/v5 v5.4.1
)

require (
	github.com/andybalholm/brotli v1.1.1 // indirect
	github.com/klauspost/compress v1.18.0 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
)
