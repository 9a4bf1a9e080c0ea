module github.com/k8spatterns/config-watcher/bench/tool

go 1.26.0

require golang.org/x/image v0.48.0
