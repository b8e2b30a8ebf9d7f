// Package workload implements the benchmark's routes (bench/http/workloads.py is the definition)
// for the Go peers, so that net/http and fasthttp run exactly the same code per request.
package workload

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"
)

// Record is one of bench/http/gen_data.py's records. Field order is the JSON key order, matching
// the order in which Python writes the decoded maps.
type Record struct {
	ID          int64   `msgpack:"id" json:"id"`
	Name        string  `msgpack:"name" json:"name"`
	Description string  `msgpack:"description" json:"description"`
	Type        string  `msgpack:"type" json:"type"`
	Count       int64   `msgpack:"count" json:"count"`
	CreatedAt   float64 `msgpack:"created_at" json:"created_at"`
}

// Data holds what the handlers read: the 1,000 pre-encoded records, their decoded cache and the
// transfer body. It is loaded once at start-up and only read afterwards, from any goroutine.
type Data struct {
	Preencoded [][]byte
	Cache      []Record
	Transfer   []byte
}

// Load reads bench/data/ (dir); it returns an error when a file is missing or malformed.
func Load(dir string) (*Data, error) {
	packed, err := os.ReadFile(filepath.Join(dir, "records.msgpack"))
	if err != nil {
		return nil, err
	}
	d := &Data{}
	if err := msgpack.Unmarshal(packed, &d.Preencoded); err != nil {
		return nil, err
	}
	for _, p := range d.Preencoded {
		var r Record
		if err := msgpack.Unmarshal(p, &r); err != nil {
			return nil, err
		}
		d.Cache = append(d.Cache, r)
	}
	if d.Transfer, err = os.ReadFile(filepath.Join(dir, "transfer.json")); err != nil {
		return nil, err
	}
	return d, nil
}

// Fibonacci is the /fib workload's loop in uint32, so it wraps like the Cython version.
func Fibonacci(n uint32) uint32 {
	var a, b uint32 = 0, 1
	for i := uint32(0); i < n; i++ {
		a, b = b, a+b
	}
	return a
}

// Loop is /loop: two arithmetic operations and an if, one million times.
func Loop() int64 {
	var acc int64
	for i := int64(0); i < 1000000; i++ {
		acc += i * 3
		if acc > 1000000007 {
			acc -= 1000000007
		}
	}
	return acc
}

// FibBody is the /fib body.
func FibBody() []byte {
	return []byte(fmt.Sprintf("Fibonacci(10^6) = %d (with overflow)\n", Fibonacci(1000000)))
}

// LoopBody is the /loop body.
func LoopBody() []byte {
	return append(strconv.AppendInt(nil, Loop(), 10), '\n')
}

// MsgpackBody decodes every pre-encoded record and returns the count, as "1000\n".
func (d *Data) MsgpackBody() ([]byte, error) {
	out := make([]Record, 0, len(d.Preencoded))
	for _, p := range d.Preencoded {
		var r Record
		if err := msgpack.Unmarshal(p, &r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return append(strconv.AppendInt(nil, int64(len(out)), 10), '\n'), nil
}

// JSONBody encodes the cache as one document and returns its length.
func (d *Data) JSONBody() ([]byte, error) {
	doc, err := json.Marshal(d.Cache)
	if err != nil {
		return nil, err
	}
	return append(strconv.AppendInt(nil, int64(len(doc)), 10), '\n'), nil
}
