// Package regress holds amgo's performance regression guards that cannot
// flake: they count work per message (allocations), never time. Its tests run
// with `go test ./bench/regress/` and are part of `make test`.
package regress
