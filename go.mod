module github.com/k8spatterns/config-watcher

go 1.26

require (
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/stretchr/testify v1.11.1
	github.com/tidwall/gjson v1.20.2
)

require (
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.3.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
