module github.com/k8spatterns/config-watcher/bench/tool

go 1.26.0

require golang.org/x/image v0.48.0

require github.com/k8spatterns/config-watcher v0.0.0

// The audit-log reader is shared with the e2e tests (hack/audit).
replace github.com/k8spatterns/config-watcher => ../..
