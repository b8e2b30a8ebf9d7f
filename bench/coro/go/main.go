// Command corobench is the Go peer of cyserve's coroutine benchmark (bench/coro/run.py).
//
// It measures the same two workloads as cyserve._core.bench_empty and bench_fib, in the same
// way, and prints one JSON object on stdout:
//
//	corobench -mode empty -n 500000
//	corobench -mode fib -n 20000 -fib 100000
//
// The number of threads running goroutines is GOMAXPROCS, set by the caller in the environment
// (GOMAXPROCS=1 for "go-1", unset or the CPU count for "go-all").
//
// Unlike cyserve, whose spawn phase only queues coroutines and whose run phase starts the
// workers, goroutines may start running on other threads while the spawn loop is still going
// (with GOMAXPROCS=1 the spawning goroutine is preempted too). So spawn_s is "the time the spawn
// loop took", which already contains part of the run, and run_s is "the time left waiting on the
// WaitGroup". total_s is their sum, measured from before the first spawn to after Wait returns;
// it is the only figure that compares like with like across systems.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
)

type result struct {
	SpawnS     float64 `json:"spawn_s"`
	RunS       float64 `json:"run_s"`
	TotalS     float64 `json:"total_s"`
	Checksum   *uint64 `json:"checksum,omitempty"`
	GoMaxProcs int     `json:"gomaxprocs"`
	GoVersion  string  `json:"go_version"`
}

// fib returns Fibonacci(n) computed iteratively in uint32, wrapping around on overflow, as
// cyserve's bench_fib does. n comes from the command line, so the compiler cannot fold the loop;
// the results are summed into a checksum that the harness compares with cyserve's.
//
//go:noinline
func fib(n uint32) uint32 {
	var a, b uint32 = 0, 1
	for i := uint32(0); i < n; i++ {
		a, b = b, a+b
	}
	return a
}

// finish is the empty goroutine's body. A named function rather than a closure, so that the
// spawn loop allocates no closure object per goroutine: Go's cheapest way to spawn.
func finish(wg *sync.WaitGroup) { wg.Done() }

func main() {
	mode := flag.String("mode", "empty", "empty or fib")
	n := flag.Int("n", 500000, "number of goroutines")
	fibN := flag.Uint("fib", 100000, "Fibonacci index computed by each goroutine (mode fib)")
	flag.Parse()
	if *n <= 0 {
		fmt.Fprintln(os.Stderr, "corobench: -n must be positive")
		os.Exit(2)
	}

	var wg sync.WaitGroup
	var res result
	res.GoMaxProcs = runtime.GOMAXPROCS(0)
	res.GoVersion = runtime.Version()

	switch *mode {
	case "empty":
		t0 := time.Now()
		wg.Add(*n)
		for i := 0; i < *n; i++ {
			go finish(&wg)
		}
		t1 := time.Now()
		wg.Wait()
		t2 := time.Now()
		res.SpawnS = t1.Sub(t0).Seconds()
		res.RunS = t2.Sub(t1).Seconds()
		res.TotalS = t2.Sub(t0).Seconds()
	case "fib":
		// Each goroutine writes its own slot, so the sum needs no atomics and is taken after
		// Wait, outside the timed region.
		out := make([]uint32, *n)
		k := uint32(*fibN)
		t0 := time.Now()
		wg.Add(*n)
		for i := 0; i < *n; i++ {
			go func(slot *uint32) {
				*slot = fib(k)
				wg.Done()
			}(&out[i])
		}
		t1 := time.Now()
		wg.Wait()
		t2 := time.Now()
		var sum uint64
		for _, v := range out {
			sum += uint64(v)
		}
		res.SpawnS = t1.Sub(t0).Seconds()
		res.RunS = t2.Sub(t1).Seconds()
		res.TotalS = t2.Sub(t0).Seconds()
		res.Checksum = &sum
	default:
		fmt.Fprintf(os.Stderr, "corobench: unknown -mode %q\n", *mode)
		os.Exit(2)
	}
	if err := json.NewEncoder(os.Stdout).Encode(&res); err != nil {
		fmt.Fprintln(os.Stderr, "corobench:", err)
		os.Exit(1)
	}
}
