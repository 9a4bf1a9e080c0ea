package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// RestartedForAnnotation is R in the state model (doc.go): the digest of
// the data every selected pod was last restarted for, or adopted.
const RestartedForAnnotation = "config-watcher.k8spatterns.io/restarted-for"

// RestartingAnnotation is I in the state model: "sha256:…/uid,uid,…", the
// digest a round restarts for and the pods it began with.
const RestartingAnnotation = "config-watcher.k8spatterns.io/restarting"

// maxIntentPods bounds the intent's size (annotations may total 256 KiB).
// A larger round writes "*": every selected pod.
const maxIntentPods = 2000

// digest is D, R or I's data: the SHA-256 of a ConfigMap's data
// (dataHash), or the HMAC-SHA256 of a Secret's (secretHash, keyed); zero is
// none.
type digest struct {
	sum [sha256.Size]byte
	// keyed: a Secret's. It is written only in the annotations of the
	// Secret's state ConfigMap (text), and shown nowhere else.
	keyed bool
}

const (
	digestPrefix      = "sha256:"
	keyedDigestPrefix = "hmac-sha256:"
)

// text is the annotation's form, "sha256:<64 hex digits>" or
// "hmac-sha256:<64 hex digits>", or "" for none.
func (d digest) text() string {
	switch {
	case d.isZero():
		return ""
	case d.keyed:
		return keyedDigestPrefix + hex.EncodeToString(d.sum[:])
	}
	return digestPrefix + hex.EncodeToString(d.sum[:])
}

// String is the form for logs: the annotation's form, or nothing of a
// Secret's data.
func (d digest) String() string {
	if d.keyed {
		return "(not shown: Secret data)"
	}
	return d.text()
}

// MarshalText gives String to encoding/json and log/slog.
func (d digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d digest) isZero() bool { return d.sum == [sha256.Size]byte{} }

// parseDigest reads the annotation's form. The all-zero digest (only a hand
// edit writes it) is not one.
func parseDigest(s string) (digest, bool) {
	var d digest
	text, ok := strings.CutPrefix(s, digestPrefix)
	if !ok {
		text, d.keyed = strings.CutPrefix(s, keyedDigestPrefix)
	}
	if (!ok && !d.keyed) || len(text) != hex.EncodedLen(len(d.sum)) {
		return digest{}, false
	}
	if _, err := hex.Decode(d.sum[:], []byte(text)); err != nil {
		return digest{}, false
	}
	return d, !d.isZero()
}

// intent is RestartingAnnotation as read.
type intent struct {
	text string // "" for none
	hash digest
	all  bool // "*": the round's pods are not named
	uids map[string]bool
}

func (in intent) present() bool { return in.text != "" }

func (in intent) has(uid string) bool { return in.all || in.uids[uid] }

func newIntent(hash digest, pods []podRef) intent {
	uids := "*"
	if len(pods) <= maxIntentPods {
		names := make([]string, len(pods))
		for i, p := range pods {
			names[i] = p.uid
		}
		uids = strings.Join(names, ",")
	}
	return parseIntent(hash.text() + "/" + uids)
}

// parseIntent reads the annotation. One that cannot be read is still an
// intent, for no data: a round was cut short, and its pods are mixed.
func parseIntent(v string) intent {
	if v == "" {
		return intent{}
	}
	in := intent{text: v}
	text, list, _ := strings.Cut(v, "/")
	in.hash, _ = parseDigest(text)
	if list == "*" {
		in.all = true
		return in
	}
	in.uids = map[string]bool{}
	for uid := range strings.SplitSeq(list, ",") {
		if uid != "" {
			in.uids[uid] = true
		}
	}
	return in
}

// truncate bounds user-provided text in logs.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
