package main

import (
	"testing"

	"github.com/k8spatterns/config-watcher/watch"
)

// TestAcceptMatchesWatch ensures the metadata-only recordings ask for exactly what a
// watch.ListWatcher with MetadataOnly asks for (the recorder keeps copies: it is
// stdlib only).
func TestAcceptMatchesWatch(t *testing.T) {
	if acceptMetadataList != watch.MetadataListAccept {
		t.Errorf("acceptMetadataList = %q, watch.MetadataListAccept = %q", acceptMetadataList, watch.MetadataListAccept)
	}
	if acceptMetadata != watch.MetadataAccept {
		t.Errorf("acceptMetadata = %q, watch.MetadataAccept = %q", acceptMetadata, watch.MetadataAccept)
	}
}
