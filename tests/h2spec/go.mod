// The h2spec release that `make test` and `make h2spec` run (tests/h2spec_run.py builds it with
// `go build -mod=readonly` from this folder), with every dependency pinned by go.sum. h2spec
// 2.2.1 has no go.mod of its own, so `go install ...@v2.2.1` resolved its dependencies to their
// latest releases on each install: a new golang.org/x/net could change or break the conformance
// run from one day to the next, and the module proxy was needed even with Go's caches warm.
// Pinned here, a warm module cache builds it offline, and a change of versions is a reviewed
// commit. This file and go.sum are ours; no Go source is kept in this tree.
module cyserve.invalid/h2spec

go 1.26.0

tool github.com/summerwind/h2spec/cmd/h2spec

require (
	github.com/fatih/color v1.19.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/summerwind/h2spec v2.2.1+incompatible // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)
