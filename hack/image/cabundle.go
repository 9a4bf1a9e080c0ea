package main

import (
	"bytes"
	"encoding/pem"
	"errors"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// caBundle is the PEM file the images carry at /etc/ssl/certs/ca-certificates.crt:
// Mozilla's NSS roots as golang.org/x/crypto/x509roots/fallback ships them, at the
// version go.mod pins, so that the bundle (and the image digest) depends on the commit
// and not on the machine that builds it. A root that NSS trusts only for certificates
// issued before a date is left out: PEM cannot carry that constraint, and trusting it
// without the date would trust more than Mozilla does.
func caBundle() ([]byte, error) {
	var buf bytes.Buffer
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate}); err != nil {
			return nil, err
		}
	}
	if buf.Len() == 0 {
		return nil, errors.New("the pinned root bundle holds no unconstrained root")
	}
	return buf.Bytes(), nil
}
