module cyserve.local/bench/coro

go 1.26
