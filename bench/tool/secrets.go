package main

import (
	"encoding/base64"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"
)

// secretKind is one kind of Secret in the mix cmdSecrets creates: what a cluster's
// Secrets mostly are (credentials of a few dozen bytes, tokens, registry logins),
// with a share of TLS certificates of about 4 KiB.
type secretKind struct {
	typ  string
	data func(r *rand.Rand) map[string][]byte
}

// secretMix is picked from by index modulo its length: 60 % passwords, 15 % tokens,
// 5 % registry logins, 20 % TLS.
var secretMix = func() []secretKind {
	password := secretKind{"Opaque", func(r *rand.Rand) map[string][]byte {
		return map[string][]byte{"username": []byte("app-" + randText(r, 8)), "password": []byte(randText(r, 32))}
	}}
	token := secretKind{"Opaque", func(r *rand.Rand) map[string][]byte {
		return map[string][]byte{"token": []byte(randText(r, 800))}
	}}
	registry := secretKind{"kubernetes.io/dockerconfigjson", func(r *rand.Rand) map[string][]byte {
		auth := base64.StdEncoding.EncodeToString([]byte("robot:" + randText(r, 40)))
		return map[string][]byte{".dockerconfigjson": []byte(`{"auths":{"registry.example.com":{"username":"robot","password":"` +
			randText(r, 40) + `","auth":"` + auth + `"}}}`)}
	}}
	tls := secretKind{"kubernetes.io/tls", func(r *rand.Rand) map[string][]byte {
		// A leaf and an intermediate certificate, and an RSA-2048 key: 4.1 KB.
		return map[string][]byte{
			"tls.crt": pem(r, "CERTIFICATE", 900, 2),
			"tls.key": pem(r, "PRIVATE KEY", 1216, 1),
		}
	}}
	mix := []secretKind{}
	for range 12 {
		mix = append(mix, password)
	}
	mix = append(mix, token, token, token, registry)
	return append(mix, tls, tls, tls, tls)
}()

func randText(r *rand.Rand, n int) string {
	b := make([]byte, n*3/4+3)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return base64.RawURLEncoding.EncodeToString(b)[:n]
}

// pem is count PEM blocks of der random bytes each, 64 columns, as a certificate
// file holds.
func pem(r *rand.Rand, label string, der, count int) []byte {
	var sb strings.Builder
	for range count {
		b := make([]byte, der)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		s := base64.StdEncoding.EncodeToString(b)
		sb.WriteString("-----BEGIN " + label + "-----\n")
		for len(s) > 64 {
			sb.WriteString(s[:64] + "\n")
			s = s[64:]
		}
		sb.WriteString(s + "\n-----END " + label + "-----\n")
	}
	return []byte(sb.String())
}

// cmdSecrets creates Secrets secret-FROM … secret-(FROM+N-1) of the mix above, the
// same for the same index; every -every'th carries the selector annotation (a
// selector that matches no pod), the others none.
func cmdSecrets(args []string) error {
	fs := flag.NewFlagSet("secrets", flag.ExitOnError)
	base, ns, annotation, n, from, workers := bulkFlags(fs)
	every := fs.Int("every", 500, "annotate every so many")
	_ = fs.Parse(args)
	a := api{*base}
	done := progress("Secrets", *n)
	var dataBytes, annotated, tls atomic.Int64
	start := time.Now()
	err := parallel(*n, *workers, func(i int) error {
		idx := *from + i
		name := fmt.Sprintf("secret-%05d", idx)
		kind := secretMix[idx%len(secretMix)]
		data := kind.data(rand.New(rand.NewPCG(uint64(idx), 22)))
		meta := map[string]any{"name": name}
		if idx%*every == 0 {
			meta["annotations"] = map[string]string{*annotation: "bench-secret=" + name}
			annotated.Add(1)
		}
		s := map[string]any{"apiVersion": "v1", "kind": "Secret", "type": kind.typ, "metadata": meta, "data": data}
		if _, err := a.must("POST", nsPath(*ns, "secrets", ""), s, "application/json", 201, 409); err != nil {
			return err
		}
		for _, v := range data {
			dataBytes.Add(int64(len(v)))
		}
		if kind.typ == "kubernetes.io/tls" {
			tls.Add(1)
		}
		done()
		return nil
	})
	el := time.Since(start)
	fmt.Printf("created %d Secrets (%d TLS, %d annotated; %.1f MB of data, decoded) in %s (%.0f/s)\n", *n, tls.Load(), annotated.Load(),
		float64(dataBytes.Load())/1e6, el.Round(time.Millisecond), float64(*n)/el.Seconds())
	return err
}
