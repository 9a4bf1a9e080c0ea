package main

import (
	"testing"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// TestAcceptMatchesWatch ensures the metadata-only recordings ask for exactly what a
// watch.ListWatcher with MetadataOnly asks for (the recorder keeps copies: it is
// stdlib only).
func TestAcceptMatchesTheController(t *testing.T) {
	if acceptMetadataList != apiclient.MetadataListAccept {
		t.Errorf("acceptMetadataList = %q, apiclient.MetadataListAccept = %q", acceptMetadataList, apiclient.MetadataListAccept)
	}
	if acceptMetadata != apiclient.MetadataAccept {
		t.Errorf("acceptMetadata = %q, apiclient.MetadataAccept = %q", acceptMetadata, apiclient.MetadataAccept)
	}
}
