package main

import (
	"os"
	"strings"
	"testing"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// TestAcceptMatchesTheController ensures the metadata-only recordings of hack/record.sh
// ask for exactly what a watch.ListWatcher with MetadataOnly asks for (the script keeps
// copies of apiclient's Accept headers).
func TestAcceptMatchesTheController(t *testing.T) {
	script, err := os.ReadFile("../record.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"accept_metadata_list='" + apiclient.MetadataListAccept + "'",
		"accept_metadata='" + apiclient.MetadataAccept + "'",
	} {
		if !strings.Contains(string(script), "\n"+want+"\n") {
			t.Errorf("hack/record.sh has no line %s", want)
		}
	}
}
