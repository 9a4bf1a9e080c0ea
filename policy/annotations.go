package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// RestartedForAnnotation holds, on each ConfigMap the controller acts for,
// the digest of the data every selected pod was last restarted for (or that
// the controller adopted): R in the state model (doc.go). It is what makes
// restarts exactly-once across controller restarts and lost watch history.
const RestartedForAnnotation = "config-watcher.k8spatterns.io/restarted-for"

// RestartingAnnotation is I in the state model: written before a round's
// first restart, it names the digest the round restarts for and the uids of
// the pods it began with; the record that ends the round removes it.
const RestartingAnnotation = "config-watcher.k8spatterns.io/restarting"

// maxIntentPods bounds the intent's size (a uid is 36 bytes; annotations
// may total 256 KiB). A larger round records "*": every selected pod.
const maxIntentPods = 2000

// digest is the SHA-256 of a ConfigMap's data (see dataHash). The zero
// value stands for no digest.
type digest [sha256.Size]byte

const digestPrefix = "sha256:"

// String is the annotation's form, "sha256:<64 hex digits>", or "" for none.
func (d digest) String() string {
	if d.isZero() {
		return ""
	}
	return digestPrefix + hex.EncodeToString(d[:])
}

// MarshalText gives the annotation's form to encoding/json and log/slog.
func (d digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d digest) isZero() bool { return d == digest{} }

// short abbreviates d for messages.
func (d digest) short() string { return truncate(d.String(), len(digestPrefix)+12) }

// parseDigest reads the annotation's form. A string that is not one, or is
// the all-zero digest (no SHA-256 of anything, only a hand edit writes it),
// is not a digest.
func parseDigest(s string) (digest, bool) {
	var d digest
	text, ok := strings.CutPrefix(s, digestPrefix)
	if !ok || len(text) != hex.EncodedLen(len(d)) {
		return digest{}, false
	}
	if _, err := hex.Decode(d[:], []byte(text)); err != nil {
		return digest{}, false
	}
	return d, !d.isZero()
}

// intent is a round in progress as recorded on the ConfigMap:
// "sha256:…/uid,uid,…", or "sha256:…/*" when the round was too large to
// name its pods.
type intent struct {
	text string // the annotation as read; "" for none
	hash digest
	all  bool // "*": the round's pods are not named
	uids map[string]bool
}

func (in intent) present() bool { return in.text != "" }

// has reports whether the intent names the pod (every pod, for "*").
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
	return parseIntent(hash.String() + "/" + uids)
}

// parseIntent reads the annotation. One that cannot be read is still an
// intent, for no data: it tells that a round was cut short, and its pods
// are mixed.
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
